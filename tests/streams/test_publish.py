"""The worker's stream writer on real Redis: entry types, bounded length, expiry, and a dead Redis
that never slows the caller."""

from __future__ import annotations

import json
import socket
import uuid

import redis

from app.streams.publish import Publisher, QueryStream, stream_key


def chars(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_bursts_finish_and_end_become_ordered_entries(redis_url: str) -> None:
    pub = Publisher(redis_url, maxlen=100, ttl_seconds=60)
    qid = uuid.uuid4()
    stream = QueryStream(pub, qid, chars)
    stream.on_delta([ord(" "), ord("a")])
    stream.on_delta([ord("b"), ord(" ")])
    stream.finish("ab c", [ord(c) for c in " ab c"])  # " c" was never delivered as a delta
    stream.end("succeeded")
    assert pub.flush()
    rows = redis.Redis.from_url(redis_url, decode_responses=True).xrange(stream_key(qid))
    fields = [f for _, f in rows]
    assert [f["type"] for f in fields] == ["token", "token", "token", "end"]
    assert [f["text"] for f in fields[:3]] == ["a", "b", " c"]  # the space waited for "c"
    assert [json.loads(f["ids"]) for f in fields[:3]] == [[32, 97], [98, 32], [99]]
    assert fields[-1]["status"] == "succeeded"
    assert all(float(f["t"]) > 0 for f in fields[:3])


def test_text_held_back_at_the_end_is_sent_before_end(redis_url: str) -> None:
    pub = Publisher(redis_url, maxlen=100, ttl_seconds=60)
    qid = uuid.uuid4()
    # "é" as two code units that a byte-level decoder would see as one incomplete character.
    renders = {1: "ok \ufffd", 2: "ok \ufffd"}
    stream = QueryStream(pub, qid, lambda ids: renders[len(ids)])
    stream.on_delta([1])
    stream.on_delta([2])
    stream.finish("ok é", [1, 2])
    stream.end("succeeded")
    assert pub.flush()
    rows = redis.Redis.from_url(redis_url, decode_responses=True).xrange(stream_key(qid))
    texts = [f.get("text") for _, f in rows]
    assert texts == ["ok", "", " é", None]


def test_a_stream_is_trimmed_to_maxlen_and_expires(redis_url: str) -> None:
    pub = Publisher(redis_url, maxlen=50, ttl_seconds=30)
    qid = uuid.uuid4()
    stream = QueryStream(pub, qid, chars)
    for _ in range(2000):
        stream.on_delta([ord("x")])
    assert pub.flush(30)
    client = redis.Redis.from_url(redis_url)
    # MAXLEN ~ trims whole macro nodes (100 entries by default): bounded, if not exact.
    assert client.xlen(stream_key(qid)) <= 50 + 100
    assert 0 < client.ttl(stream_key(qid)) <= 30


def test_a_hung_redis_never_blocks_the_engine_thread() -> None:
    # A "Redis" that accepts connections and never answers: the writer thread hangs in its
    # round trip (until its 2 s socket timeout) while the engine's callbacks keep returning.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        pub = Publisher(f"redis://127.0.0.1:{hung.getsockname()[1]}/0", maxlen=10, ttl_seconds=10)
        stream = QueryStream(pub, uuid.uuid4(), chars)
        for _ in range(1000):
            stream.on_delta([ord("y")])
        stream.end("succeeded")
    assert pub.flush(60)  # the writes failed (logged), and the thread lives on
    stream.on_delta([ord("z")])
    assert pub.flush(60)


def test_a_stale_attempt_cannot_write_once_a_newer_one_has(redis_url: str) -> None:
    # Two worker processes (two publishers): attempt 1 stalled past its lease, attempt 2 took over.
    old, new = (Publisher(redis_url, maxlen=100, ttl_seconds=60) for _ in range(2))
    qid = uuid.uuid4()
    first = QueryStream(old, qid, chars, attempt=1)
    first.on_delta([ord("a")])
    assert old.flush()
    second = QueryStream(new, qid, chars, attempt=2)
    second.reset(2)
    second.on_delta([ord("b")])
    assert new.flush()
    first.on_delta([ord("x")])  # the resumed stale attempt
    first.finish("ax", [ord("a"), ord("x")])
    first.end("succeeded")
    assert old.flush()
    second.finish("b", [ord("b")])
    second.end("succeeded")
    assert new.flush()
    rows = redis.Redis.from_url(redis_url, decode_responses=True).xrange(stream_key(qid))
    assert [(f["type"], f.get("text") or f.get("attempt") or f.get("status")) for _, f in rows] == [
        ("token", "a"),
        ("reset", "2"),
        ("token", "b"),
        ("end", "succeeded"),
    ]
