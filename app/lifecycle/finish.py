"""The one transition of a query to a final state, with the privacy setting applied in it.

A query becomes ``succeeded`` (its answer recorded), ``failed`` (an error in the pipeline) or
``failed`` (the reaper gave up on it after too many lost workers). All three go through
``finish_query``: one UPDATE sets the status, ``done_at``, the error and the question in its stored
form (``store_questions``: clear, hashed or redacted; app/privacy.py says what each keeps),
so a final query never keeps its question in clear by a path that forgot to scrub it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from app.db.models import Query, utcnow
from app.privacy import stored_form
from app.requests import FINAL_STATUSES, QueryStatus
from app.settings import Settings

MAX_ERROR_CHARS = 2000


def finish_query(
    session: Session,
    settings: Settings,
    query_id: uuid.UUID,
    status: QueryStatus,
    *,
    question: str | None = None,
    error: str | None = None,
    from_statuses: Iterable[QueryStatus] = (QueryStatus.RUNNING,),
    where: Iterable[ColumnElement[bool]] = (),
    times: dict[str, datetime | None] | None = None,
) -> bool:
    """Make the query final in ``session`` (the caller commits); True if this call moved it.

    Only a query in one of ``from_statuses`` that matches every ``where`` condition moves, so two
    racing finishers cannot both win. ``question`` is the clear question when the caller has it
    (read from the row otherwise, only when it has to be rewritten). ``times`` adds timestamps
    (``done_at`` defaults to now).
    """
    if status not in FINAL_STATUSES:
        raise ValueError(f"status: {status!r} is not final (expected one of {FINAL_STATUSES})")
    values: dict[str, Any] = {"status": status, "error": None, "done_at": utcnow()}
    values.update(times or {})
    if error is not None:
        values["error"] = error[:MAX_ERROR_CHARS]
    if settings.store_questions != "clear":
        if question is None:
            question = session.scalar(select(Query.question).where(Query.id == query_id))
        if question is not None:
            kept = stored_form(question, settings.store_questions)
            values["question"] = kept
            if kept != question:
                # A batch re-run refuses questions not kept in clear (app/privacy.py).
                values["question_stored"] = settings.store_questions
    result = session.execute(
        update(Query)
        .where(Query.id == query_id, Query.status.in_(tuple(from_statuses)), *where)
        .values(**values)
    )
    return bool(getattr(result, "rowcount", 0))
