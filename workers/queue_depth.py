"""How many messages wait in each queue of the broker, for the API's ``specrag_queue_depth``.

On Redis a queue is kombu's family of priority lists (workers/priority.py): the depth is the sum of
their lengths, one pipelined LLEN each. The embedded broker (kombu's SQLAlchemy transport) keeps
messages in its database: the depth is the count of visible ones, read with one query rather than
a passive declare per queue. Other transports are asked with a passive declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery
from sqlalchemy import create_engine, inspect, text

import workers.priority as priority
from workers.wakeup import is_redis, redis_client

_engines: dict[str, Any] = {}


def queue_depths(app: Celery, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting per queue in ``app``'s broker; raises when the broker cannot be read."""
    url = str(app.conf.broker_url or "")
    if is_redis(url):
        keys = {queue: priority.priority_keys(queue) for queue in queues}
        pipe = redis_client(url).pipeline(transaction=False)
        for names in keys.values():
            for key in names:
                pipe.llen(key)
        lengths = iter(pipe.execute())
        return {queue: sum(int(next(lengths)) for _ in names) for queue, names in keys.items()}
    if url.startswith("sqla+"):
        return _sqla_depths(url.removeprefix("sqla+"), queues)
    depths = {}
    with app.pool.acquire(block=True, timeout=2) as conn:
        for queue in queues:
            _, count, _ = conn.default_channel.queue_declare(queue=queue, passive=True)
            depths[queue] = int(count)
    return depths


def _sqla_depths(url: str, queues: Sequence[str]) -> dict[str, int]:
    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = create_engine(url, pool_pre_ping=True)
    depths = dict.fromkeys(queues, 0)
    with engine.connect() as conn:
        # kombu creates its tables on first use: before that, nothing can be waiting.
        if not inspect(conn).has_table("kombu_message"):
            return depths
        rows = conn.execute(
            text(
                "SELECT q.name, COUNT(m.id) FROM kombu_queue q "
                "JOIN kombu_message m ON m.queue_id = q.id AND m.visible GROUP BY q.name"
            )
        )
        for name, count in rows:
            if name in depths:
                depths[name] = int(count)
    return depths
