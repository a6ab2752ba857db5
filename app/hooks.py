"""After-answer hooks: work that follows a query's final state, registered by the rooms that own it.

The pipeline calls ``run_after_answer`` once a query became final (succeeded or failed) and its
record is committed; audit (shadow sampling, privacy scrubbing), grounding and metrics register
here, so the pipeline imports none of them. Grounding, once stored, calls the after-grounding
hooks (the metrics' groundedness histogram). A hook that raises is logged and does not touch the answer or the
other hooks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answered:
    """What a hook learns about one query that became final."""

    query_id: uuid.UUID
    status: str
    """Final status: "succeeded" or "failed"."""
    queue: str = "answer"
    """The queue the query was answered from ("answer" or "batch")."""
    tenant: str | None = None
    stats: dict[str, Any] | None = None
    """``GenerationStats.to_dict()`` with the service timings filled in; None when it failed."""
    model_pair: str | None = None
    method: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    """The request's stored parameters (method, k, max_tokens, temperature, seed)."""


AfterAnswerHook = Callable[[Any, Answered], None]
"""A hook gets the worker's resources (settings, session factory, ...) and the answered query."""

_hooks: list[AfterAnswerHook] = []


def register_after_answer(hook: AfterAnswerHook) -> None:
    """Run ``hook`` after every answer from now on (registering the same hook twice is a no-op)."""
    if hook not in _hooks:
        _hooks.append(hook)


def unregister_after_answer(hook: AfterAnswerHook) -> None:
    """Stop running ``hook`` (tests; a hook not registered is ignored)."""
    if hook in _hooks:
        _hooks.remove(hook)


def run_after_answer(resources: Any, answered: Answered) -> None:
    """Call every registered hook in registration order; a failing hook is logged, never raised."""
    for hook in list(_hooks):
        try:
            hook(resources, answered)
        except Exception:
            log.exception("after-answer hook %r failed for query %s", hook, answered.query_id)


AfterGroundingHook = Callable[[Any, Answered, dict[str, Any]], None]
"""Gets the worker's resources, the answered query and its stored grounding (the JSON of
``GET /v1/queries/{id}``'s ``grounding``): the metrics' histogram of groundedness."""

_grounding_hooks: list[AfterGroundingHook] = []


def register_after_grounding(hook: AfterGroundingHook) -> None:
    """Run ``hook`` after every answer's grounding is stored (registering twice is a no-op)."""
    if hook not in _grounding_hooks:
        _grounding_hooks.append(hook)


def unregister_after_grounding(hook: AfterGroundingHook) -> None:
    """Stop running ``hook`` (tests; a hook not registered is ignored)."""
    if hook in _grounding_hooks:
        _grounding_hooks.remove(hook)


def run_after_grounding(resources: Any, answered: Answered, grounding: dict[str, Any]) -> None:
    """Call every after-grounding hook; a failing hook is logged, never raised."""
    for hook in list(_grounding_hooks):
        try:
            hook(resources, answered, grounding)
        except Exception:
            log.exception("after-grounding hook %r failed for query %s", hook, answered.query_id)
