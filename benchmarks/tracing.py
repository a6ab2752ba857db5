"""Tracing's cost under service load: the same traffic with tracing off and on, interleaved.

One ``specrag api`` and one ``specrag worker`` (threads pool, tiny random-weight pair) on
PostgreSQL and a private Redis; the traced variant sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` to an
OTLP/HTTP sink in a process of its own (testkit/otlp.py ``OtlpSink``: it stores each export's
bytes at a lower priority and decodes them after the timed traffic, as a collector on another
machine would take nothing of this one) and samples everything (``always_on``). Variants
alternate within and across rounds (off/on, on/off, ...), each with fresh processes, so that the
machine's drift hits both alike. Per round and variant:

- burst: ``--burst`` questions POSTed at once; throughput = burst / (first queued → last answered);
- sequential: ``--sequential`` questions one at a time; P50/P95 of total latency as stored
  (queued → answered).

Prints per-round rows, the medians over rounds, the traced/untraced ratios of the medians with
the spread of the per-round ratios, and the spans a traced query exports by name; writes
benchmarks/results/tracing.json (``--out`` elsewhere).

    flock /tmp/bench.lock env PYTHONPATH=$PWD .venv/bin/python -m benchmarks.tracing \\
        [--rounds 4] [--burst 120] [--sequential 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
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

from app.audit.stats import quantile
from benchmarks.service import tiny_pair
from benchmarks.support import (
    RedisServer,
    create_database,
    database_url,
    drop_database,
    free_port,
    goal,
    note,
    write_result,
)
from testkit.otlp import OtlpSink, ReceivedSpan

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What does assert do?"
VARIANTS = ("off", "on")
CLIENT = 3  # OTLP's SpanKind number

GOALS = [
    goal("tracing", "service throughput, tracing on (sampling every query) / off", "throughput_ratio",
         ">=", 0.97, "x"),
    goal("tracing", "service p95 latency, tracing on (sampling every query) / off", "p95_ratio",
         "<=", 1.05, "x"),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""


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
            cpu0 = {"api": _cpu_s(api.pid), "worker": _cpu_s(worker.proc.pid)}  # type: ignore[union-attr]
            burst = [submit(client) for _ in range(args.burst)]
            wait(burst, 1800)
            sequential = []
            for _ in range(args.sequential):
                sequential.append(submit(client))
                wait(sequential[-1:], 120)
            cpu1 = {"api": _cpu_s(api.pid), "worker": _cpu_s(worker.proc.pid)}  # type: ignore[union-attr]
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
        "p50_ms": quantile(totals, 0.5),
        "p95_ms": quantile(totals, 0.95),
        "answered": len(totals),
        # CPU time per timed query (burst and sequential), API and worker processes.
        **{
            f"{k}_cpu_ms": (cpu1[k] - cpu0[k]) * 1000 / (args.burst + args.sequential) for k in cpu0
        },
    }


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sql(s: ReceivedSpan) -> bool:
    system = s.attributes.get("db.system.name", s.attributes.get("db.system"))
    return s.kind == CLIENT and system not in (None, "redis")


def census(spans: list[ReceivedSpan]) -> dict[str, Any]:
    """What a traced query exports: spans per query trace (those with an ``answer query``), by
    name and by service, and how many spans arrived outside query traces."""
    traces: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    queries = [t for t in traces.values() if any(s.name == "answer query" for s in t)]
    others = [t for t in traces.values() if not any(s.name == "answer query" for s in t)]
    n = max(len(queries), 1)
    names = Counter(s.name for t in queries for s in t)
    services = Counter(s.service for t in queries for s in t)
    inside = sum(len(t) for t in queries)
    return {
        "query_traces": len(queries),
        "spans_per_query": inside / n,
        "per_query_by_name": {k: round(v / n, 2) for k, v in names.most_common()},
        "per_query_by_service": {k: round(v / n, 2) for k, v in services.most_common()},
        "sql_spans_per_query": round(sum(1 for t in queries for s in t if _sql(s)) / n, 2),
        "spans_outside_query_traces": len(spans) - inside,
        "outside_by_name": dict(
            Counter(s.name for t in others for s in t).most_common(8)
        ),
    }  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every round's figures per variant, their medians, the on/off ratios and the span census."""
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
        base.update(args.env)
        rounds: list[dict[str, Any]] = []
        with OtlpSink(work / "spans.bin") as sink:
            for n in range(args.rounds):
                order = VARIANTS if n % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    row = _one_round(variant, base, sink.endpoint, work, key, args, factory)
                    row["round"] = n
                    rounds.append(row)
                    note(f"round {n} {variant}: {row}")
            time.sleep(1.0)  # the last traced round's final batch (its processes flushed at exit)
            spans = sink.spans()
            if args.keep_spans is not None:
                shutil.copyfile(sink.path, args.keep_spans)
        engine.dispose()
    finally:
        redis.stop()
        drop_database(dbname)
    metrics = ("throughput_qps", "p50_ms", "p95_ms", "api_cpu_ms", "worker_cpu_ms")
    med = {v: {m: statistics.median(r[m] for r in rounds if r["variant"] == v) for m in metrics}
           for v in VARIANTS}  # fmt: skip
    paired = {
        m: [
            next(r[m] for r in rounds if r["round"] == n and r["variant"] == "on")
            / next(r[m] for r in rounds if r["round"] == n and r["variant"] == "off")
            for n in range(args.rounds)
        ]
        for m in metrics
    }
    return {
        "rounds": rounds,
        "median": med,
        "throughput_ratio": med["on"]["throughput_qps"] / med["off"]["throughput_qps"],
        "p50_ratio": med["on"]["p50_ms"] / med["off"]["p50_ms"],
        "p95_ratio": med["on"]["p95_ms"] / med["off"]["p95_ms"],
        "cpu_ms_added": {
            k: med["on"][f"{k}_cpu_ms"] - med["off"][f"{k}_cpu_ms"] for k in ("api", "worker")
        },
        "round_ratios": paired,
        "spans": census(spans),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "keep_spans")},
    }


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="Off/on pairs, order alternating.")
    parser.add_argument("--burst", type=int, default=120, help="Questions POSTed at once.")
    parser.add_argument("--sequential", type=int, default=60, help="Questions one at a time.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="A variable for both variants' processes (e.g. SPECRAG_TRACE_SQL=1); repeatable.",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="Write the figures here instead.")
    parser.add_argument(
        "--keep-spans",
        type=Path,
        default=None,
        help="Copy the raw exports (testkit/otlp.py's sink file) here.",
    )
    args = parser.parse_args()
    args.env = dict(e.partition("=")[::2] for e in args.env)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="specrag-bench-") as tmp:
        r = run(args, Path(tmp))
    print(
        "| round | tracing | queries/s (burst) | p50 ms | p95 ms | API CPU ms/q | worker CPU ms/q |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, row in [
        *((r["round"], r) for r in r["rounds"]),
        *(("median", {**r["median"][v], "variant": v}) for v in VARIANTS),
    ]:
        print(f"| {label} | {row['variant']} | {row['throughput_qps']:.2f} | {row['p50_ms']:.1f} | "
              f"{row['p95_ms']:.1f} | {row['api_cpu_ms']:.1f} | {row['worker_cpu_ms']:.1f} |")  # fmt: skip
    rr = r["round_ratios"]
    print(f"\ntraced/untraced (ratio of medians; per-round ratios' range): throughput "
          f"{r['throughput_ratio']:.3f} ({_spread(rr['throughput_qps'])}), p50 "
          f"{r['p50_ratio']:.3f} ({_spread(rr['p50_ms'])}), p95 {r['p95_ratio']:.3f} "
          f"({_spread(rr['p95_ms'])}); CPU added per query: API "
          f"{r['cpu_ms_added']['api']:.2f} ms, worker {r['cpu_ms_added']['worker']:.2f} ms")  # fmt: skip
    c = r["spans"]
    print(
        f"{c['spans_per_query']:.1f} spans per traced query ({c['query_traces']} query traces; "
        f"SQL {c['sql_spans_per_query']}); {c['spans_outside_query_traces']} spans outside"
    )
    for name, per in c["per_query_by_name"].items():
        print(f"  {per:6.2f}  {name}")
    print(f"outside query traces: {c['outside_by_name']}")
    figures = {
        "throughput_ratio": round(r["throughput_ratio"], 4),
        "p95_ratio": round(r["p95_ratio"], 4),
        "p50_ratio": round(r["p50_ratio"], 4),
        "round_ratios": {k: [round(x, 4) for x in v] for k, v in rr.items()},
        "median": r["median"],
        "cpu_ms_added": r["cpu_ms_added"],
        "rounds": r["rounds"],
        "spans": c,
        "args": r["args"],
    }
    notes = {
        "throughput_ratio": f"per-round {_spread(rr['throughput_qps'])}; "
        f"{r['median']['off']['throughput_qps']:.1f} q/s off, {args.rounds} rounds; "
        f"{c['spans_per_query']:.0f} spans per query",
        "p95_ratio": f"per-round {_spread(rr['p95_ms'])}; {r['median']['off']['p95_ms']:.0f} ms off",
    }
    write_result("tracing", figures, GOALS, notes, out=args.out)


if __name__ == "__main__":
    main()
