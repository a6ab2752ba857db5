"""Tracing's cost under service load: the same traffic with tracing off and on, interleaved.

Two deployments run side by side for the whole measurement, identical but for tracing: each one
``specrag api`` and one ``specrag worker`` (threads pool, tiny random-weight pair) on a
PostgreSQL database, a Redis database and a data directory of its own. The traced one sets
``OTEL_EXPORTER_OTLP_ENDPOINT`` to an OTLP/HTTP sink in a process of its own (testkit/otlp.py
``OtlpSink``: it stores each export's bytes at a lower priority and the spans are decoded after
the timed traffic, as a collector on another machine would take nothing of this one) and samples
everything (``always_on``). The traffic alternates between them in short rounds (off then on,
then on then off, ...), so that the shared machine's drift hits both alike; the idle deployment
only polls its broker meanwhile. Per round and deployment:

- burst: ``--burst`` questions POSTed at once; throughput = burst / (first queued → last answered);
- sequential: ``--sequential`` questions one at a time; total latency as stored (queued →
  answered), P50/P95 per round and over all rounds;
- CPU: the API's and the worker's CPU time (/proc) per query over both phases.

Prints per-round rows, the medians over rounds, the traced/untraced ratios (throughput and CPU:
of the per-round medians; latency: of the percentiles over all rounds) with the spread of the
per-round ratios, and the spans a traced query exports by name; writes
benchmarks/results/tracing.json (``--out`` elsewhere).

    flock /tmp/bench.lock env PYTHONPATH=$PWD .venv/bin/python -m benchmarks.tracing \\
        [--rounds 8] [--burst 120] [--sequential 60] [--env SPECRAG_TRACE_SQL=true] [--control]
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


def _q(values: list[float], p: float) -> float:
    found = quantile(values, p)
    assert found is not None, "no latencies"
    return found


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deployment:
    """One variant's API and worker on a database, Redis database and data directory of its own."""

    def __init__(self, variant: str, work: Path, redis_url: str, models: tuple[Path, Path]) -> None:
        self.variant, self.work, self.redis_url, self.models = variant, work, redis_url, models
        self.dbname = create_database()
        self.api: subprocess.Popen[bytes] | None = None
        self.worker: Any = None
        self.url = ""
        self.auth: dict[str, str] = {}

    def prepare(
        self, extra_env: dict[str, str], endpoint: str, *, traced: bool, sampler: str = "always_on"
    ) -> None:
        """Migrate, ingest the demo documents, make a key; start the API and the worker."""
        from app.db import make_engine, make_session_factory
        from app.db.schema import upgrade
        from app.keys import create_key
        from app.resources import Resources
        from app.settings import Settings
        from workers.process import WorkerProcess, settings_env

        target, draft = self.models
        settings = Settings(
            data_dir=self.work / "data", database_url=database_url(self.dbname),
            broker_url=self.redis_url, target_model=target, draft_model=draft, device="cpu",
            tenant_submissions_per_second=0, tenant_max_in_flight=10_000,
        )  # fmt: skip
        self.engine = make_engine(settings)
        upgrade(self.engine)
        self.factory = make_session_factory(self.engine)
        corpus = ROOT / "demo" / "corpus"
        Resources(settings, self.factory).retrieval.ingest(
            [corpus / n for n in ("assert.md", "pass.md", "del.md")], collection="docs",
            tenant="bench",
        )  # fmt: skip
        with self.factory() as session:
            self.auth = {"Authorization": f"Bearer {create_key(session, 'bench')}"}
        env = {k: v for k, v in settings_env(settings).items() if not k.startswith("OTEL_")}
        env.update(extra_env)
        if traced:
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_SAMPLER=sampler)
        self.worker = WorkerProcess(
            env, self.work / "worker.log", name=f"bench-{self.variant}", cwd=ROOT
        ).start()
        port = free_port()
        self._log = (self.work / "api.log").open("ab")
        self.api = subprocess.Popen(
            [str(Path(sys.executable).parent / "specrag"), "api", "--host", "127.0.0.1",
             "--port", str(port)], env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        """Until the API answers /healthz and the worker consumes."""
        assert self.api is not None
        deadline = time.monotonic() + 120
        while True:
            if self.api.poll() is not None:
                raise RuntimeError(f"specrag api ({self.variant}) exited")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"specrag api ({self.variant}) not healthy in 120 s")
            time.sleep(0.2)
        self.worker.wait_ready()

    def submit(self, client: httpx.Client, max_tokens: int) -> uuid.UUID:
        """POST one question; its id."""
        body = {"question": QUESTION, "collection": "docs", "max_tokens": max_tokens}
        made = client.post(f"{self.url}/v1/queries", json=body, headers=self.auth)
        made.raise_for_status()
        return uuid.UUID(made.json()["id"])

    def wait(self, ids: list[uuid.UUID], timeout: float) -> None:
        """Until none of ``ids`` is queued or running (read from the database every 20 ms)."""
        from sqlalchemy import func, select

        from app.db import Query

        deadline = time.monotonic() + timeout
        while True:
            with self.factory() as session:
                open_ = session.scalar(
                    select(func.count()).select_from(Query)
                    .where(Query.id.in_(ids), Query.status.in_(("queued", "running")))
                )  # fmt: skip
            if not open_:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{open_} queries still open ({self.variant})")
            time.sleep(0.02)

    def cpu(self) -> dict[str, float]:
        """CPU seconds of the API and the worker so far."""
        assert self.api is not None
        return {"api": _cpu_s(self.api.pid), "worker": _cpu_s(self.worker.proc.pid)}

    def measure(self, client: httpx.Client, args: Any) -> dict[str, Any]:
        """One round on this deployment: a burst, then sequential questions."""
        from sqlalchemy import select

        from app.db import Query

        cpu0 = self.cpu()
        burst = [self.submit(client, args.max_tokens) for _ in range(args.burst)]
        self.wait(burst, 1800)
        sequential = []
        for _ in range(args.sequential):
            sequential.append(self.submit(client, args.max_tokens))
            self.wait(sequential[-1:], 120)
        cpu1 = self.cpu()
        with self.factory() as session:
            rows = session.execute(
                select(Query.queued_at, Query.done_at, Query.status).where(Query.id.in_(burst))
            ).all()
            stats = [
                q.stats
                for q in session.scalars(select(Query).where(Query.id.in_(sequential)))
                if q.stats is not None and q.stats.total_ms is not None
            ]
        totals = [float(st.total_ms or 0.0) for st in stats]
        # Where a sequential query's time went: the stored stages, and the rest (claim, prompt,
        # record, the broker's hop) as total minus them.
        stages = []
        for st in stats:
            parts = {"queue_ms": st.queue_ms or 0.0, "retrieval_ms": st.retrieval_ms or 0.0,
                     "generation_ms": st.generation_ms or 0.0}  # fmt: skip
            stages.append({**parts, "rest_ms": float(st.total_ms or 0.0) - sum(parts.values())})
        assert all(r.status == "succeeded" for r in rows), "a burst query did not succeed"
        assert len(totals) == args.sequential, "a sequential query has no stats"
        wall = (max(r.done_at for r in rows) - min(r.queued_at for r in rows)).total_seconds()
        n = args.burst + args.sequential
        return {
            "variant": self.variant,
            "throughput_qps": args.burst / wall,
            "p50_ms": _q(totals, 0.5),
            "p95_ms": _q(totals, 0.95),
            # CPU time per query over both phases (the deployment is idle otherwise).
            "api_cpu_ms": (cpu1["api"] - cpu0["api"]) * 1000 / n,
            "worker_cpu_ms": (cpu1["worker"] - cpu0["worker"]) * 1000 / n,
            "totals_ms": totals,
            "stages": stages,
        }

    def stop(self) -> None:
        """Stop the API and the worker; drop the database."""
        if self.api is not None:
            self.api.terminate()
            self.api.wait(timeout=30)
            self._log.close()
        if self.worker is not None:
            self.worker.stop()
        if hasattr(self, "engine"):
            self.engine.dispose()
        drop_database(self.dbname)


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
        "spans_per_query": round(inside / n, 2),
        "per_query_by_name": {k: round(v / n, 2) for k, v in names.most_common()},
        "per_query_by_service": {k: round(v / n, 2) for k, v in services.most_common()},
        "sql_spans_per_query": round(sum(1 for t in queries for s in t if _sql(s)) / n, 2),
        "spans_outside_query_traces": len(spans) - inside,
        "outside_by_name": dict(Counter(s.name for t in others for s in t).most_common(8)),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every round's figures per variant, their medians, the on/off ratios and the span census."""
    models = tiny_pair(work / "models")
    redis = RedisServer(work)
    redis.start()
    deployments: dict[str, Deployment] = {}
    try:
        with OtlpSink(work / "spans.bin") as sink:
            for i, variant in enumerate(VARIANTS):
                (work / variant).mkdir()
                deployments[variant] = Deployment(variant, work / variant, redis.url(i), models)
                traced = variant == "on" and not args.control
                deployments[variant].prepare(
                    args.env, sink.endpoint, traced=traced, sampler=args.sampler
                )
            rounds: list[dict[str, Any]] = []
            with httpx.Client(timeout=30) as client:
                for d in deployments.values():
                    d.wait_ready()
                    for _ in range(args.warmup):
                        d.wait([d.submit(client, args.max_tokens)], 120)
                for n in range(args.rounds):
                    for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:
                        row = {"round": n, **deployments[variant].measure(client, args)}
                        rounds.append(row)
                        note(f"round {n} {variant}: " + ", ".join(
                            f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)))  # fmt: skip
            for d in deployments.values():
                d.stop()
            deployments.clear()
            time.sleep(1.0)  # the traced processes flush as they stop
            spans = sink.spans()
            if args.keep_spans is not None:
                shutil.copyfile(sink.path, args.keep_spans)
    finally:
        for d in deployments.values():
            d.stop()
        redis.stop()
    return summarize(rounds, spans, args)


def summarize(rounds: list[dict[str, Any]], spans: list[ReceivedSpan], args: Any) -> dict[str, Any]:
    """Medians per variant, the on/off ratios with the per-round ratios, pooled latency."""
    metrics = ("throughput_qps", "p50_ms", "p95_ms", "api_cpu_ms", "worker_cpu_ms")
    med = {v: {m: statistics.median(r[m] for r in rounds if r["variant"] == v) for m in metrics}
           for v in VARIANTS}  # fmt: skip
    by_round = {(r["round"], r["variant"]): r for r in rounds}
    paired = {
        m: [by_round[n, "on"][m] / by_round[n, "off"][m] for n in range(args.rounds)]
        for m in metrics
    }
    pooled = {v: [t for r in rounds if r["variant"] == v for t in r["totals_ms"]] for v in VARIANTS}
    latency = {v: {"p50_ms": _q(pooled[v], 0.5), "p95_ms": _q(pooled[v], 0.95)} for v in VARIANTS}
    stages = {
        v: {
            k: round(statistics.median(st[k] for r in rounds if r["variant"] == v
                                       for st in r["stages"]), 2)
            for k in ("queue_ms", "retrieval_ms", "generation_ms", "rest_ms")
        }
        for v in VARIANTS
    }  # fmt: skip
    return {
        "rounds": [
            {k: v for k, v in r.items() if k not in ("totals_ms", "stages")} for r in rounds
        ],
        "stage_medians": stages,
        "median": med,
        "pooled_latency": latency,
        "throughput_ratio": med["on"]["throughput_qps"] / med["off"]["throughput_qps"],
        "p50_ratio": latency["on"]["p50_ms"] / latency["off"]["p50_ms"],
        "p95_ratio": latency["on"]["p95_ms"] / latency["off"]["p95_ms"],
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
    parser.add_argument("--rounds", type=int, default=8, help="Off/on pairs, order alternating.")
    parser.add_argument("--burst", type=int, default=120, help="Questions POSTed at once.")
    parser.add_argument("--sequential", type=int, default=60, help="Questions one at a time.")
    parser.add_argument("--warmup", type=int, default=10, help="Questions per deployment first.")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="A variable for both deployments' processes (e.g. SPECRAG_TRACE_SQL=true).",
    )  # fmt: skip
    parser.add_argument(
        "--sampler", default="always_on",
        help="The traced deployment's OTEL_TRACES_SAMPLER (always_off: the instrumentation's "
        "cost without spans).",
    )  # fmt: skip
    parser.add_argument(
        "--control", action="store_true",
        help="Trace neither deployment (an A/A run: the ratios' spread with no difference).",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="Write the figures here instead.")
    parser.add_argument(
        "--keep-spans", type=Path, default=None,
        help="Copy the raw exports (testkit/otlp.py's sink file) here.",
    )  # fmt: skip
    args = parser.parse_args()
    args.env = dict(e.partition("=")[::2] for e in args.env)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="specrag-bench-") as tmp:
        r = run(args, Path(tmp))
    print(
        "| round | tracing | queries/s (burst) | p50 ms | p95 ms | API CPU ms/q | worker CPU ms/q |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = [*((row["round"], row) for row in r["rounds"]),
            *(("median", {**r["median"][v], "variant": v}) for v in VARIANTS)]  # fmt: skip
    for label, row in rows:
        print(f"| {label} | {row['variant']} | {row['throughput_qps']:.2f} | {row['p50_ms']:.1f} | "
              f"{row['p95_ms']:.1f} | {row['api_cpu_ms']:.1f} | {row['worker_cpu_ms']:.1f} |")  # fmt: skip
    rr, lat = r["round_ratios"], r["pooled_latency"]
    print(f"\nall rounds' sequential latency: off p50 {lat['off']['p50_ms']:.1f} p95 "
          f"{lat['off']['p95_ms']:.1f} ms, on p50 {lat['on']['p50_ms']:.1f} p95 "
          f"{lat['on']['p95_ms']:.1f} ms")  # fmt: skip
    for v in VARIANTS:
        print(f"{v}: sequential stage medians {r['stage_medians'][v]}")
    print(f"traced/untraced (per-round ratios' range): throughput {r['throughput_ratio']:.3f} "
          f"({_spread(rr['throughput_qps'])}), p50 {r['p50_ratio']:.3f} ({_spread(rr['p50_ms'])}), "
          f"p95 {r['p95_ratio']:.3f} ({_spread(rr['p95_ms'])}); CPU per query added: API "
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
        "pooled_latency": lat,
        "stage_medians": r["stage_medians"],
        "cpu_ms_added": r["cpu_ms_added"],
        "rounds": r["rounds"],
        "spans": c,
        "args": r["args"],
    }
    off = r["median"]["off"]
    notes = {
        "throughput_ratio": f"per-round {_spread(rr['throughput_qps'])}; {off['throughput_qps']:.1f} "
        f"q/s off; {c['spans_per_query']:.0f} spans per query; {args.rounds} interleaved rounds",
        "p95_ratio": f"all rounds' queries; per-round {_spread(rr['p95_ms'])}; "
        f"{lat['off']['p95_ms']:.0f} ms off",
    }
    if (args.control or args.sampler != "always_on") and args.out is None:
        return  # a control run backs no goal
    write_result("tracing", figures, GOALS, notes, out=args.out)


if __name__ == "__main__":
    main()
