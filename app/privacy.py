"""How a question is kept once it has been answered: in clear, hashed, or redacted.

The worker needs the clear question to retrieve and prompt, so a query is stored in clear while
it is queued or running. The transition to a final state (answer recorded, or failed for good;
app/lifecycle/finish.py) writes ``stored_form`` of it into ``queries.question`` in the same UPDATE, per
``store_questions`` (``scrub_question`` rewrites one finished query after the fact):

- ``clear``: left as asked.
- ``hashed``: ``sha256:<hex>`` of the question. Equal questions still match (repeat counts,
  "was this asked?"), but a short common question can be guessed by hashing candidates; use
  ``redacted`` when that matters.
- ``redacted``: e-mail addresses, URLs, and digit runs (phone, account, card and id numbers) are
  replaced by ``[email]``, ``[url]``, ``[number]``; the rest of the text stays readable. Pattern
  based: names and free-text secrets are not detected.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Query
from app.settings import Settings

log = logging.getLogger(__name__)
HASH_PREFIX = "sha256:"
_PATTERNS = (
    (re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+"), "[email]"),
    (re.compile(r"\b(?:https?://|www\.)\S+", re.IGNORECASE), "[url]"),
    # Digit runs of 3+ (allowing spaces, dots and dashes inside, as phone and card numbers have).
    (re.compile(r"\+?\d[\d .-]{1,}\d"), "[number]"),
)


def hash_question(question: str) -> str:
    """``sha256:<hex>`` of the question (UTF-8)."""
    return HASH_PREFIX + hashlib.sha256(question.encode("utf-8")).hexdigest()


def redact_question(question: str) -> str:
    """The question with e-mail addresses, URLs and digit runs masked."""
    for pattern, token in _PATTERNS:
        question = pattern.sub(token, question)
    return question


def stored_form(question: str, mode: str) -> str:
    """The form ``question`` is kept in under ``mode`` (clear, hashed or redacted)."""
    if mode == "clear":
        return question
    if mode == "hashed":
        return question if question.startswith(HASH_PREFIX) else hash_question(question)
    if mode == "redacted":
        return redact_question(question)
    raise ValueError(f"store_questions: unknown mode {mode!r}; choose clear, hashed or redacted")


def matches_stored(stored: str, question: str) -> bool:
    """True when ``stored`` is ``question`` as asked, hashed or redacted (idempotent retries).

    A retry after its query became final finds the question already scrubbed; comparing against
    each stored form of the incoming question tells a true retry from a different request. (Two
    questions that redact alike count as the same: redaction keeps no more than that.)
    """
    return stored in (question, hash_question(question), redact_question(question))


def stored_in_clear(query: Query) -> bool:
    """True when the query's question is kept as asked (a batch may re-run it)."""
    if query.question_stored is not None:
        return query.question_stored == "clear"
    # Rows scrubbed before ``question_stored`` existed: a hash is recognisable by its form.
    return not re.fullmatch(r"sha256:[0-9a-f]{64}", query.question)


def kept_in_clear() -> ColumnElement[bool]:
    """SQL: the query's question is kept as asked (what may feed drafts and datasets)."""
    return Query.question_stored.is_(None) | (Query.question_stored == "clear")


def scrub_question(
    session_factory: sessionmaker[Session], settings: Settings, query_id: uuid.UUID
) -> None:
    """Rewrite a finished query's question into its stored form (no-op for ``clear``)."""
    if settings.store_questions == "clear":
        return
    try:
        _scrub(session_factory, settings.store_questions, query_id)
    except SQLAlchemyError:
        # The answer stands; the question stays in clear until an admin re-runs the scrub.
        log.exception("could not scrub the question of query %s", query_id)


def _scrub(session_factory: sessionmaker[Session], mode: str, query_id: uuid.UUID) -> None:
    with session_factory() as session:
        question = session.scalar(select(Query.question).where(Query.id == query_id))
        if question is None:
            return
        kept = stored_form(question, mode)
        if kept != question:
            session.execute(
                update(Query)
                .where(Query.id == query_id, Query.status.in_(("succeeded", "failed")))
                .values(question=kept, question_stored=mode)
            )
            session.commit()
