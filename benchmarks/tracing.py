"""Tracing's cost under service load: the same traffic traced, untraced, and untraced again.

Three deployments run side by side for the whole measurement (benchmarks/tracing_deployment.py:
an API and a worker each, on a database, Redis database and data directory of their own):
``off`` and ``control`` untraced and identical, ``on`` exporting every span (``always_on``) to an
OTLP/HTTP sink in a process of its own (testkit/otlp.py ``OtlpSink``: it stores each export's
bytes at a lower priority, and the spans are decoded after the timed traffic, as a collector on
another machine would take nothing of this one). ``control`` against ``off`` is an A/A
comparison under the very same design: what the run reads as a cost where there is none.

Each round runs every arm twice, in a palindrome rotated per round (off on control control on
off, then on control off off control on, ...; testkit/paired.py), so that a drift of the
shared machine over a round hits every arm alike. A phase: ``--burst`` questions POSTed at once
(throughput = burst / first queued → last answered), then ``--sequential`` one at a time (total
latency as stored, queued → answered); the API's and the worker's CPU time (/proc) over both.
Before the timed rounds, every arm answers ``--warmup`` questions and one untimed round.

Per round and arm: throughput over both bursts, p50/p95 of both phases' sequential queries, CPU
per query; each against ``off`` of the same round. The figures are the medians of those
per-round ratios with their sign-test interval (at least 95%), for ``on`` and ``control``; the page's
rows say whether the control's intervals are narrow enough to judge the goals. Also printed: the
pooled latencies, the sequential queries' stage medians and the spans a traced query exports.
Writes benchmarks/results/tracing.json (``--out`` elsewhere).

    flock /tmp/bench.lock env PYTHONPATH=$PWD .venv/bin/python -m benchmarks.tracing \\
        [--rounds 10] [--burst 60] [--sequential 30] [--env SPECRAG_TRACE_SQL=true]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.audit.stats import quantile
from benchmarks.service import tiny_pair
from benchmarks.support import RedisServer, goal, note, write_result
from benchmarks.tracing_deployment import Deployment, census
from testkit import paired
from testkit.otlp import OtlpSink, ReceivedSpan

ARMS = ("off", "on", "control")
"""The reference, the traced arm and the reference's untraced twin (the A/A control)."""
COMPARED = ("on", "control")
RESOLUTION = {"throughput_qps": 0.03, "p95_ms": 0.05}
"""The smallest costs the goals ask to see: the control's intervals must lie within them."""
METRICS = ("throughput_qps", "p50_ms", "p95_ms", "api_cpu_ms", "worker_cpu_ms")

GOALS = [
    goal("tracing", "service throughput, tracing on (sampling every query) / off", "throughput_ratio",
         ">=", 0.97, "x"),
    goal("tracing", "service p95 latency, tracing on (sampling every query) / off", "p95_ratio",
         "<=", 1.05, "x"),
    goal("tracing", "the run resolves the goals: the A/A control's intervals within 3% "
         "(throughput) and 5% (p95)", "control_resolves", "==", True),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""


def _q(values: list[float], p: float) -> float:
    found = quantile(values, p)
    assert found is not None, "no latencies"
    return found


def arm_round(phases: list[dict[str, Any]]) -> dict[str, float]:
    """One arm's figures over its phases of a round (both bursts, all sequential queries)."""
    totals = [t for ph in phases for t in ph["totals_ms"]]
    queries = sum(ph["queries"] for ph in phases)
    return {
        "throughput_qps": sum(ph["burst"] for ph in phases)
        / sum(ph["burst_wall_s"] for ph in phases),
        "p50_ms": _q(totals, 0.5),
        "p95_ms": _q(totals, 0.95),
        "api_cpu_ms": sum(ph["api_cpu_s"] for ph in phases) * 1000 / queries,
        "worker_cpu_ms": sum(ph["worker_cpu_s"] for ph in phases) * 1000 / queries,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every phase's raw figures, summarized; and the spans the traced arm exported."""
    models = tiny_pair(work / "models")
    redis = RedisServer(work)
    redis.start()
    deployments: dict[str, Deployment] = {}
    phases: list[dict[str, Any]] = []
    try:
        with OtlpSink(work / "spans.bin") as sink:
            for i, arm in enumerate(ARMS):
                (work / arm).mkdir()
                deployments[arm] = Deployment(arm, work / arm, redis.url(i), models)
                deployments[arm].prepare(
                    args.env, sink.endpoint, traced=arm == "on", sampler=args.sampler
                )
            with httpx.Client(timeout=30) as client:
                for d in deployments.values():
                    d.wait_ready()
                for _ in range(args.warmup):
                    for d in deployments.values():
                        d.wait([d.submit(client, args.max_tokens)], 120)
                for n in range(-1, args.rounds):  # round -1: the untimed warm-up round
                    for arm in paired.palindrome(ARMS, n):
                        ph = deployments[arm].measure(
                            client, args.burst, args.sequential, args.max_tokens
                        )
                        note(f"round {n} {arm}: {args.burst / ph['burst_wall_s']:.2f} q/s, "
                             f"p50 {_q(ph['totals_ms'], 0.5):.1f} ms")  # fmt: skip
                        if n >= 0:
                            phases.append({"round": n, **ph})
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
    return summarize(phases, spans, args.rounds)


def summarize(phases: list[dict[str, Any]], spans: list[ReceivedSpan], rounds: int) -> dict:
    """Per round and arm; the per-round ratios against ``off`` and their medians and intervals;
    the latencies pooled over all rounds; the stage medians; the span census."""
    table = {
        (n, arm): arm_round([p for p in phases if p["round"] == n and p["arm"] == arm])
        for n in range(rounds)
        for arm in ARMS
    }
    ratios = {
        arm: {m: [table[n, arm][m] / table[n, "off"][m] for n in range(rounds)] for m in METRICS}
        for arm in COMPARED
    }
    added = {
        arm: {
            k: [
                table[n, arm][f"{k}_cpu_ms"] - table[n, "off"][f"{k}_cpu_ms"] for n in range(rounds)
            ]
            for k in ("api", "worker")
        }
        for arm in COMPARED
    }
    pooled = {a: [t for p in phases if p["arm"] == a for t in p["totals_ms"]] for a in ARMS}
    stages = {
        a: {
            k: round(statistics.median(st[k] for p in phases if p["arm"] == a
                                       for st in p["stages"]), 2)
            for k in ("queue_ms", "retrieval_ms", "generation_ms", "rest_ms")
        }
        for a in ARMS
    }  # fmt: skip
    return {
        "rounds": [{"round": n, "arm": a, **table[n, a]} for n in range(rounds) for a in ARMS],
        "ratios": {a: {m: paired.summary(ratios[a][m]) for m in METRICS} for a in COMPARED},
        "round_ratios": {
            a: {m: [round(x, 4) for x in v] for m, v in ratios[a].items()} for a in COMPARED
        },
        "cpu_ms_added": {a: {k: paired.summary(v) for k, v in added[a].items()} for a in COMPARED},
        "pooled_latency": {
            a: {"p50_ms": _q(pooled[a], 0.5), "p95_ms": _q(pooled[a], 0.95)} for a in ARMS
        },
        "median": {
            a: {m: statistics.median(table[n, a][m] for n in range(rounds)) for m in METRICS}
            for a in ARMS
        },
        "stage_medians": stages,
        "spans": census(spans),
    }


def _iv(s: dict[str, float]) -> str:
    return f"{s['median']:.3f} ({s['low']:.3f}-{s['high']:.3f})"


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the per-round table, the ratios with their intervals and the span census."""
    print("| round | arm | queries/s (burst) | p50 ms | p95 ms | API CPU ms/q | worker CPU ms/q |")
    print("|---|---|---|---|---|---|---|")
    rows = [*((row["round"], row) for row in r["rounds"]),
            *(("median", {**r["median"][a], "arm": a}) for a in ARMS)]  # fmt: skip
    for label, row in rows:
        print(f"| {label} | {row['arm']} | {row['throughput_qps']:.2f} | {row['p50_ms']:.1f} | "
              f"{row['p95_ms']:.1f} | {row['api_cpu_ms']:.1f} | {row['worker_cpu_ms']:.1f} |")  # fmt: skip
    cov = r["ratios"]["on"]["throughput_qps"]["coverage"]
    print(f"\nper-round ratios to off, median (sign-test interval, {cov:.1%}):")
    for a in COMPARED:
        x, cpu = r["ratios"][a], r["cpu_ms_added"][a]
        print(f"  {a:8} throughput {_iv(x['throughput_qps'])}, p50 {_iv(x['p50_ms'])}, p95 "
              f"{_iv(x['p95_ms'])}; CPU ms/query added: API {_iv(cpu['api'])}, worker "
              f"{_iv(cpu['worker'])}")  # fmt: skip
    for a in ARMS:
        lat = r["pooled_latency"][a]
        print(
            f"{a}: all rounds' p50 {lat['p50_ms']:.1f} p95 {lat['p95_ms']:.1f} ms; "
            f"stage medians {r['stage_medians'][a]}"
        )
    c = r["spans"]
    print(
        f"{c['spans_per_query']:.1f} spans per traced query ({c['query_traces']} query traces; "
        f"SQL {c['sql_spans_per_query']}); {c['spans_outside_query_traces']} spans outside"
    )
    for name, per in c["per_query_by_name"].items():
        print(f"  {per:6.2f}  {name}")
    print(f"outside query traces: {c['outside_by_name']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="Timed palindromic rounds.")
    parser.add_argument("--burst", type=int, default=60, help="Questions POSTed at once a phase.")
    parser.add_argument("--sequential", type=int, default=30, help="Questions one at a time.")
    parser.add_argument("--warmup", type=int, default=10, help="Questions per arm first.")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="A variable for every deployment's processes (e.g. SPECRAG_TRACE_SQL=true).",
    )  # fmt: skip
    parser.add_argument(
        "--sampler", default="always_on",
        help="The traced arm's OTEL_TRACES_SAMPLER (always_off: the instrumentation's cost "
        "without spans).",
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
    report(r, args)
    on, ctl = r["ratios"]["on"], r["ratios"]["control"]
    resolves = all(1 - d <= ctl[m]["low"] <= ctl[m]["high"] <= 1 + d for m, d in RESOLUTION.items())
    figures = {
        "throughput_ratio": round(on["throughput_qps"]["median"], 4),
        "p95_ratio": round(on["p95_ms"]["median"], 4),
        "p50_ratio": round(on["p50_ms"]["median"], 4),
        "control_resolves": resolves,
        **{
            k: r[k]
            for k in (
                "ratios",
                "round_ratios",
                "cpu_ms_added",
                "median",
                "pooled_latency",
                "stage_medians",
                "rounds",
                "spans",
            )
        },
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "keep_spans")},
    }
    off = r["median"]["off"]
    span_n = r["spans"]["spans_per_query"]
    cov = f"{on['throughput_qps']['coverage']:.0%}"

    def iv(s: dict[str, float]) -> str:
        return f"{s['low']:.3f}-{s['high']:.3f}"

    notes = {
        "throughput_ratio": f"median of {args.rounds} palindromic rounds' ratios, {cov} interval "
        f"{iv(on['throughput_qps'])}; A/A control {_iv(ctl['throughput_qps'])}; "
        f"{off['throughput_qps']:.1f} q/s off; {span_n:.0f} spans per query",
        "p95_ratio": f"median of rounds' ratios, {cov} interval {iv(on['p95_ms'])}; A/A control "
        f"{_iv(ctl['p95_ms'])}; {off['p95_ms']:.0f} ms off",
        "control_resolves": f"A/A control, {cov} intervals: throughput "
        f"{_iv(ctl['throughput_qps'])}, p95 {_iv(ctl['p95_ms'])}; {args.rounds} rounds",
    }
    if args.sampler != "always_on" and args.out is None:
        return  # a run without spans backs no goal
    write_result("tracing", figures, GOALS, notes, out=args.out)


if __name__ == "__main__":
    main()
