"""Answer streaming latency: from the worker handing over a verified burst to the client reading it.

Every token entry a worker writes carries ``t``, the wall-clock time ``on_delta`` (or the final
burst) handed it over; the client notes when the matching SSE event (same id) arrived. Both run
on one machine, so the difference is the stream's own latency: publisher thread, Redis, the API's
hub, HTTP. The API runs as its own ``specrag api`` process, as in production.

- ``worker``: a real ``specrag worker`` subprocess on the demo pair answers queries submitted one
  at a time through the API; the client streams each and times its first token event.
- ``transport``: N streams of running queries open at once, a writer thread publishing a burst
  to every stream every ``--interval`` ms (a decode step), the client timing every event.

    .venv/bin/python -m benchmarks.streaming --queries 20 --streams 1 50 500

Needs ``redis-server`` on 127.0.0.1:6379 (a free database number is used and flushed); the
database is an SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.support import claim_redis_db, free_port, goal, release_redis_db, write_result
from workers.process import WorkerProcess, settings_env

GOALS = [
    goal(
        "streaming",
        "first token event p50 after the worker verifies it (a lone query, live worker)",
        "first_event_p50_ms",
        "<=",
        50,
        "ms",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def row(name: str, ms: list[float]) -> str:
    """One table row: count and p50/p95/p99/max in milliseconds."""
    return (
        f"| {name} | {len(ms)} | {quantile(ms, 0.5):.1f} | {quantile(ms, 0.95):.1f} | "
        f"{quantile(ms, 0.99):.1f} | {max(ms):.1f} |"
    )


@contextmanager
def api_process(settings: Any) -> Iterator[str]:
    """``specrag api`` as its own process on a free loopback port; its base URL."""
    import httpx

    port = free_port()
    specrag = str(Path(sys.executable).parent / "specrag")
    with open(settings.data_dir / "api.log", "ab") as log:
        proc = subprocess.Popen(
            [specrag, "api", "--host", "127.0.0.1", "--port", str(port)],
            env=settings_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the API did not start"
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def entry_times(url: str, key: str) -> dict[str, float]:
    """Entry id → ``t`` (hand-over time) of a stream's token entries."""
    import redis

    rows = redis.Redis.from_url(url, decode_responses=True).xrange(key)
    return {i: float(f["t"]) for i, f in rows if f.get("type") == "token"}


def bench_worker(settings: Any, key: str, n: int, max_tokens: int) -> list[float]:
    """First-token latencies (ms) of ``n`` queries answered by a live worker subprocess."""
    from app.client import SpecragClient
    from app.streams import stream_key

    worker = WorkerProcess(settings_env(settings), settings.data_dir / "worker.log").start()
    try:
        worker.wait_ready(timeout=600)
        latencies = []
        questions = ["What does the assert statement do?", "How does del work?", "What is pass?"]
        with api_process(settings) as base, SpecragClient(base, key, timeout=120) as client:
            for i in range(n):
                qid = client.submit(questions[i % 3], "demo", max_tokens=max_tokens)
                first: tuple[str, float] | None = None
                for event in client.stream(qid, timeout=120):
                    if event.event == "token" and first is None and event.id:
                        first = (event.id, time.time())
                assert first is not None, f"query {qid}: no token event"
                sent = entry_times(settings.resolved_stream_url, stream_key(qid))[first[0]]
                latencies.append((first[1] - sent) * 1000)
        return latencies
    finally:
        worker.stop(timeout=60)


async def _read(client: Any, url: str, got: dict[str, float], ready: asyncio.Event) -> None:
    async with client.stream("GET", url) as response:
        async for line in response.aiter_lines():
            if line.startswith("retry:"):
                ready.set()
            elif line.startswith("id: "):
                got[line[4:]] = time.time()
            elif line.startswith("event: done"):
                return


def bench_transport(
    settings: Any, key: str, streams: int, bursts: int, interval_ms: float
) -> list[float]:
    """Latencies (ms) of every token event over ``streams`` open streams of running queries."""
    import httpx

    from app.db import Answer, Query, prepare, utcnow
    from app.lifecycle.queries import get_or_create_tenant
    from app.streams import QueryStream, publisher, stream_key

    _, factory = prepare(settings)
    with factory() as session:
        tenant = get_or_create_tenant(session, "default")
        ids = [uuid.uuid4() for _ in range(streams)]
        session.add_all(
            Query(id=i, tenant_id=tenant.id, collection="demo", question="?", params={},
                  status="running", queue="answer", source="benchmark", attempts=1,
                  heartbeat_at=utcnow() + timedelta(hours=1))  # the API's reaper: not dead
            for i in ids
        )  # fmt: skip
        session.commit()
    url = settings.resolved_stream_url
    pub = publisher(url, settings.stream_maxlen, settings.stream_ttl_seconds)

    def write() -> None:
        writers = [QueryStream(pub, i, lambda t: "x" * len(t)) for i in ids]
        for _ in range(bursts):
            for w in writers:
                w.on_delta([1, 2])
            time.sleep(interval_ms / 1000)
        with factory() as session:
            session.add_all(Answer(query_id=i, text="x" * 2 * bursts, model_pair="-", engine="-")
                            for i in ids)  # fmt: skip
            session.query(Query).filter(Query.id.in_(ids)).update({"status": "succeeded"})
            session.commit()
        for w in writers:
            w.end("succeeded")

    async def run() -> list[dict[str, float]]:
        limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=0)
        headers = {"Authorization": f"Bearer {key}"}
        got: list[dict[str, float]] = [{} for _ in ids]
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=120) as client:
            ready = [asyncio.Event() for _ in ids]
            tasks = [
                asyncio.create_task(_read(client, f"{base}/v1/queries/{i}/stream", g, r))
                for i, g, r in zip(ids, got, ready, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 120)
            await asyncio.sleep(0.2)  # every subscription has joined the hub's read
            writer = threading.Thread(target=write)
            writer.start()
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
            writer.join()
        return got

    with api_process(settings) as base:
        got = asyncio.run(run())
    latencies = []
    for qid, seen in zip(ids, got, strict=True):
        sent = entry_times(url, stream_key(qid))
        latencies += [(seen[i] - t) * 1000 for i, t in sent.items() if i in seen]
    return latencies


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20, help="worker: queries, one at a time")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 50, 500])
    parser.add_argument("--bursts", type=int, default=20, help="transport: bursts per stream")
    parser.add_argument("--interval", type=float, default=50.0, help="transport: ms between bursts")
    args = parser.parse_args()

    from app.db import prepare
    from app.keys import create_key
    from app.resources import Resources
    from app.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="specrag-stream-bench-"))
    settings = Settings(
        data_dir=tmp,
        broker_url=f"redis://127.0.0.1:6379/{claim_redis_db()}",
        device="cpu",
        torch_threads=1,
    )
    _, factory = prepare(settings)
    with factory() as session:
        key = create_key(session, "default")
    print("| case | events | p50 ms | p95 ms | p99 ms | max ms |\n|---|---|---|---|---|---|")
    p50: dict[str, float | None] = {}
    try:
        if args.queries:
            retrieval = Resources(settings, factory).retrieval
            retrieval.ingest([ROOT / "demo" / "corpus"], collection="demo")
            ms = bench_worker(settings, key, args.queries, args.max_tokens)
            print(row("worker (demo pair), first token event", ms), flush=True)
            p50["worker"] = quantile(ms, 0.5)
        for n in args.streams:
            ms = bench_transport(settings, key, n, args.bursts, args.interval)
            print(row(f"{n} open streams, every token event", ms), flush=True)
            p50[f"{n} streams"] = quantile(ms, 0.5)
    finally:
        release_redis_db(int((settings.broker_url or "").rsplit("/", 1)[1]))
    # The goal is read through a live worker; without one (--queries 0), on the bare transport.
    first = p50["worker"] if "worker" in p50 else p50.get("1 streams")
    figures = {"first_event_p50_ms": first, "p50_ms_by_case": p50}
    notes = {"first_event_p50_ms": "through a live worker" if "worker" in p50 else "bare transport"}
    write_result("streaming", figures, GOALS, notes)


if __name__ == "__main__":
    main()
