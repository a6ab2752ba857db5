"""The after-answer hook that teaches the worker's suffix trees every answer it records.

Registered after the token-id hook (app/drafts/hooks.py), which stores what the trees read; a
process whose resources hold no started ``SharedSuffixMemory`` (the API, ``suffix`` off) does
nothing here.
"""

from __future__ import annotations

from typing import Any

from app.hooks import Answered, register_after_answer
from app.requests import QueryStatus


def learn_answer(resources: Any, answered: Answered) -> None:
    """Learn a succeeded answer and announce it to the other workers."""
    shared = getattr(resources, "shared_suffix_memory", None)
    if answered.status == QueryStatus.SUCCEEDED and shared is not None:
        shared.recorded(answered.query_id)


def install_hooks() -> None:
    """Register the hook (idempotent); call after the token-id hook's ``install_hooks``."""
    register_after_answer(learn_answer)
