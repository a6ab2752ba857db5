"""A message sent to one queue lands on that queue only (real Redis, queues bound as a worker does).

Batch items must never reach the interactive queue (or vice versa): priority between the two
depends on it. Every queue is declared and bound first, as a worker consuming all of them does.
"""

from __future__ import annotations

import uuid

import pytest

from app.settings import Settings
from workers import QUEUES, create_celery, send_query

pytestmark = pytest.mark.integration


def _pending(client, queue: str) -> int:  # type: ignore[no-untyped-def]
    # kombu's Redis transport keeps one list per queue, plus one per priority step ("name\x06\x16N").
    return sum(client.llen(key) for key in client.keys(f"{queue}*") if client.type(key) == b"list")


@pytest.mark.parametrize("queue", ["answer", "batch"])
def test_a_message_reaches_only_its_queue(private_redis, tmp_path, queue: str) -> None:  # type: ignore[no-untyped-def]
    import redis

    # A private Redis: no live worker of another test may consume the message before it is counted.
    url = private_redis.url()
    app = create_celery(Settings(data_dir=tmp_path, broker_url=url))
    client = redis.Redis.from_url(url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in app.amqp.queues.values():  # declare and bind every queue, as a worker does
            q(channel).declare()
        send_query(app, uuid.uuid4(), queue)
    counts = {name: _pending(client, name) for name in QUEUES}
    assert counts[queue] == 1, counts
    assert sum(counts.values()) == 1, f"one message was delivered to several queues: {counts}"
