"""The after-answer hook that keeps an answer's exact token ids for draft tuning.

Only while questions are stored in clear (``store_questions``, app/privacy.py): the prompt ids
spell the question, so a deployment that hashes or redacts questions keeps no token ids either,
and its traffic never reaches a draft's training set.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from app.drafts.records import AnswerTokens
from app.hooks import Answered, register_after_answer
from app.requests import QueryStatus

log = logging.getLogger(__name__)


def keeps_token_ids(settings: Any) -> bool:
    """Whether this process stores answers' token ids (on, and questions kept in clear)."""
    return bool(getattr(settings, "store_token_ids", False)) and settings.store_questions == "clear"


def store_token_ids(resources: Any, answered: Answered) -> None:
    """Store a succeeded answer's prompt and output ids (best effort: the answer stands)."""
    if answered.status != QueryStatus.SUCCEEDED or not keeps_token_ids(resources.settings):
        return
    if not answered.prompt_token_ids or not answered.output_token_ids:
        return
    with resources.session_factory() as session:
        session.add(
            AnswerTokens(
                query_id=answered.query_id,
                prompt_token_ids=[int(t) for t in answered.prompt_token_ids],
                output_token_ids=[int(t) for t in answered.output_token_ids],
            )
        )
        try:
            session.commit()
        except IntegrityError:
            session.rollback()  # a redelivered task: the first run's ids stand
        except SQLAlchemyError:
            session.rollback()
            log.exception("could not store the token ids of query %s", answered.query_id)


def install_hooks() -> None:
    """Register the token-id hook (idempotent)."""
    register_after_answer(store_token_ids)
