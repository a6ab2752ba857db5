"""Tracing's cost under service load: the same traffic with tracing off and on, side by side.

One ``specrag api`` and one ``specrag worker`` (threads pool, tiny random-weight pair) on
PostgreSQL and a private Redis; the traced variant sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` to an
OTLP/HTTP receiver in this process (testkit/otlp.py, decoding every export) and samples
everything (``always_on``). Variants alternate per round, each with fresh processes, so that
the machine's drift hits both alike. Per round and variant:

- burst: ``--burst`` questions POSTed at once; throughput = burst / (first queued → last answered);
- sequential: ``--sequential`` questions one at a time; P50/P95 of total latency as stored
  (queued → answered).

Prints per-round rows, the medians over rounds and traced/untraced ratios; ``--out`` writes the
figures as JSON.

    flock /tmp/bench.lock env PYTHONPATH=$PWD .venv/bin/python -m benchmarks.tracing \\
        [--rounds 3] [--burst 120] [--sequential 60] [--out runs/tracing.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.service import tiny_pair
from benchmarks.support import (
    RedisServer,
    create_database,
    database_url,
    drop_database,
    free_port,
    note,
    percentile,
)
from testkit.otlp import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What does assert do?"
VARIANTS = ("off", "on")


def _env(base: dict[str, str], variant: str, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("OTEL_")}
    if variant == "on":
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_SAMPLER="always_on")
    return env


def _wait_api(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("specrag api exited")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("specrag api not healthy in 120 s")


def _one_round(
    variant: str, base: dict[str, str], endpoint: str, work: Path, key: str, args: Any, factory: Any
) -> dict[str, Any]:
    from sqlalchemy import func, select

    from app.db import Query
    from workers.process import WorkerProcess

    env = _env(base, variant, endpoint)
    worker = WorkerProcess(env, work / f"worker-{variant}.log", name=f"bench-{variant}", cwd=ROOT)
    worker.start()
    port = free_port()
    log = (work / f"api-{variant}.log").open("ab")
    api = subprocess.Popen(
        [str(Path(sys.executable).parent / "specrag"), "api", "--host", "127.0.0.1", "--port",
         str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    body = {"question": QUESTION, "collection": "docs", "max_tokens": args.max_tokens}

    def submit(client: httpx.Client) -> uuid.UUID:
        made = client.post(f"{url}/v1/queries", json=body, headers=auth)
        made.raise_for_status()
        return uuid.UUID(made.json()["id"])

    def wait(ids: list[uuid.UUID], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with factory() as session:
                open_ = session.scalar(
                    select(func.count()).select_from(Query)
                    .where(Query.id.in_(ids), Query.status.in_(("queued", "running")))
                )  # fmt: skip
            if not open_:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{open_} queries still open")
            time.sleep(0.02)

    try:
        _wait_api(url, api)
        worker.wait_ready()
        with httpx.Client(timeout=30) as client:
            for _ in range(args.warmup):
                wait([submit(client)], 120)
            burst = [submit(client) for _ in range(args.burst)]
            wait(burst, 1800)
            sequential = []
            for _ in range(args.sequential):
                sequential.append(submit(client))
                wait(sequential[-1:], 120)
        with factory() as session:
            rows = session.execute(
                select(Query.queued_at, Query.done_at, Query.status).where(Query.id.in_(burst))
            ).all()
            totals = [
                q.stats.total_ms
                for q in session.scalars(select(Query).where(Query.id.in_(sequential)))
                if q.stats is not None
            ]
        assert all(r.status == "succeeded" for r in rows), "a burst query did not succeed"
        wall = (max(r.done_at for r in rows) - min(r.queued_at for r in rows)).total_seconds()
    finally:
        api.terminate()
        api.wait(timeout=30)
        log.close()
        worker.stop()
    return {
        "variant": variant,
        "throughput_qps": args.burst / wall,
        "p50_ms": percentile(totals, 50),
        "p95_ms": percentile(totals, 95),
        "answered": len(totals),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every round's figures per variant, their medians and the on/off ratios."""
    from app.db import make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.keys import create_key
    from app.resources import Resources
    from app.settings import Settings
    from workers.process import settings_env

    target, draft = tiny_pair(work / "models")
    dbname = create_database()
    redis = RedisServer(work)
    redis.start()
    try:
        settings = Settings(
            data_dir=work / "data", database_url=database_url(dbname), broker_url=redis.url(0),
            target_model=target, draft_model=draft, device="cpu",
            tenant_submissions_per_second=0, tenant_max_in_flight=10_000,
        )  # fmt: skip
        engine = make_engine(settings)
        upgrade(engine)
        factory = make_session_factory(engine)
        corpus = ROOT / "demo" / "corpus"
        Resources(settings, factory).retrieval.ingest(
            [corpus / n for n in ("assert.md", "pass.md", "del.md")], collection="docs",
            tenant="bench",
        )  # fmt: skip
        with factory() as session:
            key = create_key(session, "bench")
        base = settings_env(settings)
        rounds: list[dict[str, Any]] = []
        with OtlpReceiver() as receiver:
            for n in range(args.rounds):
                order = VARIANTS if n % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    row = _one_round(variant, base, receiver.endpoint, work, key, args, factory)
                    row["round"] = n
                    rounds.append(row)
                    note(f"round {n} {variant}: {row}")
            spans = len(receiver.spans)
            names = Counter(s.name for s in receiver.spans).most_common(12)
        engine.dispose()
    finally:
        redis.stop()
        drop_database(dbname)
    med = {
        v: {
            m: statistics.median(r[m] for r in rounds if r["variant"] == v)
            for m in ("throughput_qps", "p50_ms", "p95_ms")
        }
        for v in VARIANTS
    }
    return {
        "rounds": rounds,
        "median": med,
        "throughput_ratio": med["on"]["throughput_qps"] / med["off"]["throughput_qps"],
        "p95_ratio": med["on"]["p95_ms"] / med["off"]["p95_ms"],
        "spans_received": spans,
        "most_frequent_spans": names,
        "host": platform.processor() or platform.machine(),
        "args": vars(args),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=120, help="Questions POSTed at once.")
    parser.add_argument("--sequential", type=int, default=60, help="Questions one at a time.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="specrag-bench-") as tmp:
        r = run(args, Path(tmp))
    print("| round | tracing | queries/s (burst) | p50 ms | p95 ms |")
    print("|---|---|---|---|---|")
    for row in r["rounds"]:
        print(f"| {row['round']} | {row['variant']} | {row['throughput_qps']:.2f} | "
              f"{row['p50_ms']:.1f} | {row['p95_ms']:.1f} |")  # fmt: skip
    for v in VARIANTS:
        m = r["median"][v]
        print(f"| median | {v} | {m['throughput_qps']:.2f} | {m['p50_ms']:.1f} | "
              f"{m['p95_ms']:.1f} |")  # fmt: skip
    print(f"\ntraced/untraced: throughput {r['throughput_ratio']:.3f}, p95 {r['p95_ratio']:.3f}; "
          f"{r['spans_received']} spans received")  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(r, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
