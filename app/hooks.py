"""After-answer hooks: work that follows a query's final state, registered by the rooms that own it.

The pipeline calls ``run_after_answer`` once a query became final (succeeded or failed) and its
record is committed; audit (shadow sampling, privacy scrubbing), grounding and metrics register
here, so the pipeline imports none of them. Grounding, once stored, calls the after-grounding
hooks (the metrics' groundedness histogram). A hook that raises is logged and does not touch the answer or the
other hooks.

A hook may hand its work to a thread of its own and return that work's ``Future``: the task is
then free at once, and the pipeline ends the query's stream (the ``done`` event, which reads the
query back) only once those futures are resolved (``when_done``), so ``done`` carries what they
stored.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
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


AfterAnswerHook = Callable[[Any, Answered], "Future[Any] | None"]
"""A hook gets the worker's resources (settings, session factory, ...) and the answered query;
it returns None, or the future of work it handed to another thread."""

_hooks: list[AfterAnswerHook] = []


def register_after_answer(hook: AfterAnswerHook) -> None:
    """Run ``hook`` after every answer from now on (registering the same hook twice is a no-op)."""
    if hook not in _hooks:
        _hooks.append(hook)


def unregister_after_answer(hook: AfterAnswerHook) -> None:
    """Stop running ``hook`` (tests; a hook not registered is ignored)."""
    if hook in _hooks:
        _hooks.remove(hook)


def run_after_answer(resources: Any, answered: Answered) -> list[Future[Any]]:
    """Call every registered hook in registration order; a failing hook is logged, never raised.
    Returns the futures of the work hooks handed to other threads."""
    pending: list[Future[Any]] = []
    for hook in list(_hooks):
        try:
            future = hook(resources, answered)
        except Exception:
            log.exception("after-answer hook %r failed for query %s", hook, answered.query_id)
            continue
        if isinstance(future, Future):
            future.add_done_callback(functools.partial(_log_failure, hook, answered.query_id))
            pending.append(future)
    return pending


def _log_failure(hook: Any, query_id: uuid.UUID, future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error(
            "after-answer hook %r failed for query %s",
            hook,
            query_id,
            exc_info=future.exception(),
        )


def when_done(pending: Sequence[Future[Any]], then: Callable[[], None]) -> None:
    """Call ``then`` once every future of ``pending`` is resolved (done, failed or cancelled): at
    once when there is none, else on the thread that resolves the last one."""
    if not pending:
        then()
        return
    left = [len(pending)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            try:
                then()
            except Exception:
                log.exception("after-answer continuation failed")

    for future in pending:
        future.add_done_callback(one_done)


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
