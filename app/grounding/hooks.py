"""Grounding's after-answer hook: every succeeded answer is grounded and the result stored.

It runs after the commit that made the query ``succeeded`` and after the last token was handed
to the stream, so neither waits for it. In a worker (``Resources.grounding_backlog`` set) it runs
on the grounding thread (app/grounding/background.py) and the task takes its next query at once;
elsewhere (``specrag ask`` in one process, tests) it runs in the caller. Either way the stream's
``end`` entry (hence the ``done`` event, which reads the query back) follows it, so ``done``
carries the grounding. With ``SPECRAG_GROUNDING=0`` nothing is computed and answers carry no
grounding.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from app.grounding.store import ground_stored
from app.hooks import Answered, register_after_answer, run_after_grounding
from app.requests import QueryStatus

log = logging.getLogger(__name__)


def ground_answer(resources: Any, answered: Answered) -> Future[Any] | None:
    """Ground a succeeded answer and store it, then the after-grounding hooks (metrics): on the
    worker's grounding thread when it has one (the future of that work), else here (None)."""
    if answered.status != QueryStatus.SUCCEEDED or not resources.settings.grounding:
        return None
    backlog = getattr(resources, "grounding_backlog", None)
    if backlog is None:
        _ground(resources, answered)
        return None
    return backlog.submit(lambda: _ground(resources, answered))


def _ground(resources: Any, answered: Answered) -> None:
    row = ground_stored(resources.session_factory, resources.grounding_scorer, answered.query_id)
    if row is not None:
        run_after_grounding(resources, answered, row.to_dict())


def install_hooks() -> None:
    """Register grounding's after-answer hook (idempotent)."""
    register_after_answer(ground_answer)
