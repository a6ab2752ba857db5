"""The shared XREAD of an API process on real Redis: a poisoned cursor is refused before it gets
there, and a stream Redis refuses to read is dropped alone, so no reader can stall the others."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from app.streams import check_last_event_id
from app.streams.hub import StreamHub, normal_id, parse_id


@pytest.mark.parametrize(
    "bad",
    [
        "99999999999999999999999-0",  # past 64 bits: Redis answers "Invalid stream ID"
        "18446744073709551616-0",  # 2**64
        "0-18446744073709551616",
        "٤-0",  # an Arabic-Indic digit: str.isdigit says yes, Redis says no
        "1-2-3",
        "-1-0",
        " 1-0",
        "1-",
        "",
    ],
)
def test_ids_redis_would_refuse_are_refused_here(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_id(bad)
    with pytest.raises(ValueError):
        check_last_event_id(bad)


def test_ids_are_normalised() -> None:
    assert normal_id("0001-007") == "1-7"
    assert check_last_event_id("18446744073709551615-18446744073709551615") == (
        "18446744073709551615-18446744073709551615"
    )
    assert check_last_event_id("end") == "end"


async def _first_batch(hub: StreamHub, key: str, timeout: float) -> list[object]:
    sub = hub.subscribe(key, None)
    try:
        async with asyncio.timeout(timeout):
            return list(await sub.queue.get())
    finally:
        hub.unsubscribe(sub)


def test_a_stream_redis_refuses_is_dropped_and_the_others_keep_flowing(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    bad_key = f"specrag:test-hub:{uuid.uuid4().hex}"
    good_key = f"specrag:test-hub:{uuid.uuid4().hex}"
    sync.set(bad_key, "not a stream")  # XREAD on it: WRONGTYPE, for every key in the call

    async def scenario() -> tuple[bool, list[object], float]:
        hub = StreamHub(redis_url, block_ms=5_000)
        try:
            poisoned = hub.subscribe(bad_key, None)
            # The hub's XREAD held the bad key, Redis refused it, and the hub dropped it.
            async with asyncio.timeout(5):
                refused = await poisoned.queue.get()
            loop = asyncio.get_running_loop()
            started = loop.time()
            reader = asyncio.create_task(_first_batch(hub, good_key, timeout=5))
            await asyncio.sleep(0)  # the reader subscribes; the hub's XREAD blocks for 5 s
            sync.xadd(good_key, {"type": "token", "text": "hi", "ids": "[1]"})
            got = await reader
            waited = loop.time() - started
            return poisoned.failed and refused == [], got, waited
        finally:
            await hub.close()

    try:
        dropped, got, waited = asyncio.run(scenario())
    finally:
        sync.delete(bad_key, good_key)
    assert dropped  # the refused stream's reader is told (it falls back to the database)
    assert len(got) == 1 and got[0][1]["text"] == "hi"  # type: ignore[index]
    assert waited < 3.0, waited
