"""kombu's Redis priority lists in one place: which Redis keys hold a queue's waiting messages.

kombu's Redis transport keeps one list per queue and priority step: ``answer`` for step 0, then
``answer<sep><step>`` for the others (``sep`` is ``"\\x06\\x16"``, steps 0, 3, 6, 9). Counting
them with one pipelined LLEN is how a batch worker sees interactive work without kombu's slow
passive declare. The names are read from kombu itself; when a kombu release moves them, that is
logged as an error (preemption would silently stop otherwise) and the names of kombu 5 are used.
"""

from __future__ import annotations

import logging
import time
from functools import cache

from celery import Celery

from app.requests import QueueName
from workers.wakeup import is_redis, redis_client

log = logging.getLogger(__name__)

_KOMBU5_SEP = "\x06\x16"
_KOMBU5_STEPS = (0, 3, 6, 9)
_QUIET_SECONDS = 60.0
_last_warned = [0.0]


@cache
def _layout() -> tuple[str, tuple[int, ...]]:
    try:
        from kombu.transport.redis import Channel  # guarded: a kombu release may move it

        sep, steps = str(Channel.sep), tuple(int(s) for s in Channel.priority_steps)
    except (ImportError, AttributeError, TypeError, ValueError):
        log.error(
            "kombu's Redis priority layout (Channel.sep, Channel.priority_steps) is gone; "
            "assuming kombu 5's: check that batch preemption still sees interactive work",
            exc_info=True,
        )
        return _KOMBU5_SEP, _KOMBU5_STEPS
    if (sep, steps) != (_KOMBU5_SEP, _KOMBU5_STEPS):
        log.warning("kombu's Redis priority layout changed: sep %r, steps %s", sep, steps)
    return sep, steps


def priority_keys(queue: str) -> tuple[str, ...]:
    """The Redis keys of ``queue``'s lists, one per priority step (the plain name is step 0)."""
    sep, steps = _layout()
    return tuple(f"{queue}{sep}{step}" if step else queue for step in steps)


def waiting(app: Celery, queue: str = QueueName.ANSWER) -> bool:
    """Whether messages wait on ``queue`` in ``app``'s broker (False, logged, when it cannot tell).

    Called every few milliseconds while a batch item generates, so on Redis it is one pipelined
    LLEN per priority list instead of kombu's passive queue_declare, whose Python cost slows the
    generation it guards (docs/batch.md, "Interactive first").
    """
    url = str(app.conf.broker_url or "")
    try:
        if is_redis(url):
            pipe = redis_client(url).pipeline(transaction=False)
            for key in priority_keys(queue):
                pipe.llen(key)
            return any(pipe.execute())
        with app.pool.acquire(block=True, timeout=2) as conn:
            _, count, _ = conn.default_channel.queue_declare(queue=queue, passive=True)
            return bool(count)
    except Exception as exc:  # no such queue yet, or the broker hiccuped: keep going
        # Polled every few ms: one warning a minute says the broker is away without a flood.
        now = time.monotonic()
        if is_redis(url) and now - _last_warned[0] > _QUIET_SECONDS:
            _last_warned[0] = now
            log.warning("could not count waiting %s messages on Redis: %s", queue, exc)
        else:
            log.debug("could not count waiting %s messages: %s", queue, exc)
        return False
