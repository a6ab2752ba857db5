"""The broker-epoch marker on real Redis: a first look is no loss; a flushed broker is reported
once, with the same time by every process that saw the old marker."""

from __future__ import annotations

import redis

from workers.broker_epoch import MARKER, BrokerEpoch


def test_a_flushed_broker_is_reported_once_with_one_time(private_redis_db: str) -> None:
    api, worker = BrokerEpoch(private_redis_db), BrokerEpoch(private_redis_db)
    assert api.lost() is None and worker.lost() is None  # a new deployment: no loss
    assert api.lost() is None
    redis.Redis.from_url(private_redis_db).flushdb()
    late = BrokerEpoch(private_redis_db)
    assert late.lost() is None  # started after the loss: it re-creates the marker, reports nothing
    seen_by_api, seen_by_worker = api.lost(), worker.lost()
    assert seen_by_api is not None and seen_by_api == seen_by_worker
    assert api.lost() is None and worker.lost() is None  # once per loss
    assert redis.Redis.from_url(private_redis_db).exists(MARKER)


def test_an_unreachable_broker_reports_nothing() -> None:
    assert BrokerEpoch("redis://127.0.0.1:1/0").lost() is None
    assert BrokerEpoch("sqla+sqlite:///x.db").lost() is None
