"""Queue depth read from real brokers (Redis with kombu's priority lists, the embedded SQLAlchemy
broker) by the Celery dispatcher, and pending queries read from the database; a dead broker never
fails the scrape."""

from __future__ import annotations

import uuid
from pathlib import Path

from celery import Celery
from kombu import Connection, Exchange, Queue
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, Tenant
from app.metrics.queues import QueueCollector
from workers.dispatcher import CeleryDispatcher


def _publish(url: str, queue: str, priorities: list[int]) -> None:
    q = Queue(queue, Exchange(queue, type="direct"), routing_key=queue)
    with Connection(url) as conn:
        producer = conn.Producer()
        for priority in priorities:
            producer.publish(
                {"n": priority},
                exchange=q.exchange,
                routing_key=queue,
                declare=[q],
                priority=priority,
                retry=False,
            )


def _scrape(collector: QueueCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_redis_depth_sums_every_priority_list(redis_url: str) -> None:
    import redis

    # Queue names of this test only: a live worker of the same session may consume "answer".
    busy, idle = f"mt-busy-{uuid.uuid4().hex[:8]}", f"mt-idle-{uuid.uuid4().hex[:8]}"
    _publish(redis_url, busy, [0, 0, 5, 5, 5, 9])
    client = redis.Redis.from_url(redis_url)
    try:
        # kombu put the prioritised messages on lists of their own: the plain list holds two.
        assert client.llen(busy) == 2
        depth = CeleryDispatcher(Celery("depth", broker=redis_url, set_as_current=False))
        assert depth.queue_depths([busy, idle]) == {busy: 6, idle: 0}
    finally:
        client.delete(*client.keys(f"{busy}*"), *client.keys(f"_kombu.binding.{busy}*"))


def test_embedded_broker_depth_counts_visible_messages(tmp_path: Path) -> None:
    url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    depth = CeleryDispatcher(Celery("depth", broker=url, set_as_current=False))
    assert depth.queue_depths(["answer", "batch"]) == {"answer": 0, "batch": 0}  # no tables yet
    _publish(url, "answer", [0, 5, 9])
    assert depth.queue_depths(["answer", "batch"]) == {"answer": 3, "batch": 0}
    with Connection(url) as conn:
        conn.SimpleQueue("answer").get(timeout=5).ack()  # a consumer takes one
    assert depth.queue_depths(["answer", "batch"]) == {"answer": 2, "batch": 0}


def test_pending_queries_and_a_dead_broker(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        tenant = Tenant(name="acme")
        session.add(tenant)
        session.flush()
        for queue, status in [("answer", "queued")] * 3 + [
            ("answer", "running"),
            ("batch", "queued"),
            ("answer", "succeeded"),
        ]:
            session.add(
                Query(
                    tenant_id=tenant.id, collection="c", question="q?", queue=queue, status=status
                )
            )
        session.commit()
    # Port 1 on loopback: nothing listens, so the broker read fails at once.
    dead = CeleryDispatcher(Celery("dead", broker="redis://127.0.0.1:1/0", set_as_current=False))
    collector = QueueCollector(dead.queue_depths, session_factory, ["answer", "batch", "ingest"])
    samples = _scrape(collector)
    assert samples[("specrag_broker_up", ())] == 0
    assert not any(name == "specrag_queue_depth" for name, _ in samples)
    pending = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "specrag_queries_pending"
    }
    assert pending[(("queue", "answer"), ("status", "queued"))] == 3
    assert pending[(("queue", "answer"), ("status", "running"))] == 1
    assert pending[(("queue", "batch"), ("status", "queued"))] == 1
    assert pending[(("queue", "ingest"), ("status", "running"))] == 0
    assert len(pending) == 6  # succeeded and failed queries are not pending
