"""Serving benchmark: one worker answering one query at a time vs the same worker with many in flight.

Needs PostgreSQL and Redis (scripts/ensure-services.sh). Creates a fresh database, ingests four
demo documents, and runs ``specrag worker -Q answer`` subprocesses on the demo pair
(models/demo; SPECRAG_TARGET_MODEL/DRAFT_MODEL override). Variants, measured in alternation so
that the machine's drift hits all of them alike:

- ``one at a time``: ``--pool solo`` (one query at a time);
- ``loop xN``: ``--pool threads --concurrency N``: N queries in flight on the process's one loop.

Phases:
1. burst: ``--burst`` queries (greedy, ``--max-tokens``) stored and sent at once; throughput is
   queries / (first queued → last answered), and every answer is compared with the same
   question's answer under the other variants (greedy: identical under load);
2. Poisson (``--poisson-seconds`` > 0): arrivals at ``--load`` x the single-query capacity that
   phase 1 measured, for that long, on each variant; P50/P95/P99 of total latency (queued →
   answered) and of time to first token (queued → first token, as the worker recorded it).

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.serving [--burst 24] [--max-tokens 64]
        [--concurrency 4,8] [--rounds 2] [--poisson-seconds 120] [--load 1.5]
        [--poisson-concurrency N]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.batch import FILES, QUESTIONS, setup, wait_query
from benchmarks.support import drop_database, goal, note, start_worker, write_result

GOALS = [
    goal(
        "serving",
        "burst of 24 x 64 tokens on one worker, queries/s / one at a time",
        "burst_vs_one_at_a_time",
        ">=",
        2.5,
        "x",
    ),
    goal("serving", "greedy answers identical under load", "identical", "==", True),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

REPO = Path(__file__).resolve().parent.parent


def send(sf: Any, settings: Any, celery: Any, question: str, max_tokens: int) -> uuid.UUID:
    """Store one greedy query and send it to ``answer``; its id."""
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from workers import send_query

    req = validate_request(
        settings,
        {"question": question, "collection": "demo", "max_tokens": max_tokens, "temperature": 0},
    )
    with sf() as session:
        query, _ = create_query(
            session, get_or_create_tenant(session, "default"), req, source="benchmark"
        )
    send_and_mark(sf, query.id, "answer", lambda q, queue: send_query(celery, q, queue))
    return query.id


def wait_all(sf: Any, ids: list[uuid.UUID], timeout: float = 1800) -> None:
    """Return once every query is final (polled coarsely, so as not to compete for the CPU)."""
    from sqlalchemy import func, select

    from app.db import Query

    deadline = time.monotonic() + timeout
    while True:
        with sf() as session:
            left = session.scalar(
                select(func.count())
                .select_from(Query)
                .where(Query.id.in_(ids), Query.status.not_in(("succeeded", "failed")))
            )
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} queries not answered in {timeout} s")
        time.sleep(0.25)


def results(sf: Any, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    """Per query, in ``ids`` order: status, answer text, tokens, timings (s) from the database."""
    from sqlalchemy import select

    from app.db import Answer, GenerationStatsRecord, Query

    with sf() as session:
        rows = session.execute(
            select(Query, Answer.text, GenerationStatsRecord)
            .outerjoin(Answer, Answer.query_id == Query.id)
            .outerjoin(GenerationStatsRecord, GenerationStatsRecord.query_id == Query.id)
            .where(Query.id.in_(ids))
        ).all()
    by_id = {}
    for query, text, stats in rows:
        first = query.first_token_at
        by_id[query.id] = {
            "status": query.status,
            "answer": text,
            "queued_at": query.queued_at,
            "done_at": query.done_at,
            "tokens": stats.num_output_tokens if stats else 0,
            "total_ms": stats.total_ms if stats else None,
            "ttft_ms": (first - query.queued_at).total_seconds() * 1000 if first else None,
            "batch": stats.mean_batch_size if stats else None,
        }
    return [by_id[i] for i in ids]


def burst(sf: Any, settings: Any, celery: Any, n: int, max_tokens: int) -> list[dict[str, Any]]:
    """``n`` queries sent at once; their results once all are answered."""
    ids = [
        send(sf, settings, celery, f"{QUESTIONS[i % 4]} ({i % 6})", max_tokens) for i in range(n)
    ]
    wait_all(sf, ids)
    return results(sf, ids)


def poisson(
    sf: Any, settings: Any, celery: Any, rate: float, seconds: float, max_tokens: int, seed: int
) -> list[dict[str, Any]]:
    """Queries arriving at ``rate`` per second (seeded exponential gaps) for ``seconds``."""
    rng = random.Random(seed)
    ids, start, at = [], time.monotonic(), 0.0
    while True:
        at += rng.expovariate(rate)
        if at > seconds:
            break
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        i = len(ids)
        ids.append(send(sf, settings, celery, f"{QUESTIONS[i % 4]} ({i % 6})", max_tokens))
    wait_all(sf, ids)
    return results(sf, ids)


def wall_seconds(rows: list[dict[str, Any]]) -> float:
    """First queued → last answered, as the database recorded them."""
    return (max(r["done_at"] for r in rows) - min(r["queued_at"] for r in rows)).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="4,8", help="comma-separated loop sizes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poisson-seconds", type=float, default=0.0)
    parser.add_argument("--load", type=float, default=1.5, help="x single-query capacity")
    parser.add_argument(
        "--poisson-concurrency",
        type=int,
        default=None,
        help="loop size under Poisson (default: the largest)",
    )
    args = parser.parse_args()
    os.environ.setdefault("SPECRAG_TARGET_MODEL", str(REPO / "models" / "demo" / "target"))
    os.environ.setdefault("SPECRAG_DRAFT_MODEL", str(REPO / "models" / "demo" / "draft"))
    tmp = Path(tempfile.mkdtemp(prefix="specrag-bench-serving-"))
    env, dbname = setup(tmp)
    try:
        run(args, env, tmp)
    finally:
        drop_database(dbname)


def run(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> None:
    """All phases; prints the tables."""
    from app.db import prepare
    from app.resources import Resources
    from app.settings import Settings
    from workers import create_celery

    settings = Settings()
    _, sf = prepare(settings)
    Resources(settings, sf).retrieval.ingest(
        [REPO / "demo" / "corpus" / f for f in FILES], collection="demo"
    )
    celery = create_celery(settings)
    variants = [("one at a time", {"SPECRAG_WORKER_POOL": "solo"})] + [
        (f"loop x{n}", {"SPECRAG_WORKER_POOL": "threads", "SPECRAG_WORKER_CONCURRENCY": str(n)})
        for n in (int(c) for c in args.concurrency.split(","))
    ]
    bursts: dict[str, list[list[dict[str, Any]]]] = {label: [] for label, _ in variants}
    for r in range(args.rounds):
        for label, extra in variants:
            worker = start_worker(env, tmp / "worker.log", **extra)
            try:
                wait_query(sf, send(sf, settings, celery, "warm up", 4), timeout=600)
                bursts[label].append(burst(sf, settings, celery, args.burst, args.max_tokens))
            finally:
                worker.stop()
            note(f"round {r + 1} {label}: {wall_seconds(bursts[label][-1]):.1f} s")
    speedups, identical = report_burst(args, bursts)
    best = max(speedups, key=lambda label: speedups[label])
    figures = {"burst_vs_one_at_a_time": speedups[best], "identical": identical,
               "speedup_by_variant": speedups}  # fmt: skip
    write_result("serving", figures, GOALS, {"burst_vs_one_at_a_time": best})
    if args.poisson_seconds <= 0:
        return
    alone = bursts["one at a time"]
    capacity = sum(len(b) for b in alone) / sum(wall_seconds(b) for b in alone)
    rate = args.load * capacity
    loaded: dict[str, list[dict[str, Any]]] = {}
    sizes = [int(c) for c in args.concurrency.split(",")]
    size = args.poisson_concurrency or max(sizes)
    chosen = [v for v in variants if v[0] in ("one at a time", f"loop x{size}")]
    if len(chosen) < 2:
        chosen.append(
            (
                f"loop x{size}",
                {"SPECRAG_WORKER_POOL": "threads", "SPECRAG_WORKER_CONCURRENCY": str(size)},
            )
        )
    for label, extra in chosen:
        worker = start_worker(env, tmp / "worker.log", **extra)
        try:
            wait_query(sf, send(sf, settings, celery, "warm up", 4), timeout=600)
            note(f"poisson {rate:.2f}/s for {args.poisson_seconds:.0f} s: {label}")
            loaded[label] = poisson(
                sf, settings, celery, rate, args.poisson_seconds, args.max_tokens, seed=7
            )
        finally:
            worker.stop()
    report_poisson(args, capacity, rate, loaded)


def report_burst(
    args: argparse.Namespace, bursts: dict[str, list[list[dict[str, Any]]]]
) -> tuple[dict[str, float], bool]:
    """Throughput per variant (all rounds pooled) and whether greedy answers matched; returns
    each loop variant's queries/s over one at a time's, and whether every answer matched."""
    speedups: dict[str, float] = {}
    identical = True
    base = bursts["one at a time"]
    reference = {}
    for rows in base:
        for i, row in enumerate(rows):
            reference.setdefault(i % 12, row["answer"])
    base_qps = sum(len(b) for b in base) / sum(wall_seconds(b) for b in base)
    print(
        f"\nburst of {args.burst} queries, max_tokens {args.max_tokens}, greedy, one worker "
        f"(demo pair, PostgreSQL, Redis); {args.rounds} rounds alternating\n"
    )
    print(
        "| worker | queries/s | tokens/s | wall s per burst | vs one at a time | mean batch |"
        " answers identical |\n|---|---|---|---|---|---|---|"
    )
    for label, runs in bursts.items():
        rows = [r for b in runs for r in b]
        wall = sum(wall_seconds(b) for b in runs)
        same = sum(r["answer"] == reference.get(i % 12) for b in runs for i, r in enumerate(b))
        failed = sum(r["status"] != "succeeded" for r in rows)
        batch = [r["batch"] for r in rows if r["batch"] is not None]
        identical = identical and same == len(rows) and not failed
        if label != "one at a time":
            speedups[label] = len(rows) / wall / base_qps
        print(
            f"| {label} | {len(rows) / wall:.2f} | {sum(r['tokens'] for r in rows) / wall:.1f} | "
            f"{wall / len(runs):.1f} | {len(rows) / wall / base_qps:.2f} | "
            f"{sum(batch) / max(len(batch), 1):.2f} | {same}/{len(rows)}"
            + (f" ({failed} failed)" if failed else "")
            + " |"
        )
    return speedups, identical


def report_poisson(
    args: argparse.Namespace, capacity: float, rate: float, loaded: dict[str, list[dict[str, Any]]]
) -> None:
    """P50/P95/P99 of total latency and time to first token under Poisson arrivals."""
    print(
        f"\nPoisson arrivals at {args.load}x single-query capacity ({capacity:.2f}/s → "
        f"{rate:.2f}/s) for {args.poisson_seconds:.0f} s, max_tokens {args.max_tokens}\n"
    )
    print(
        "| worker | queries | answered once | total p50 / p95 / p99 ms | TTFT p50 / p95 / p99 ms |"
        "\n|---|---|---|---|---|"
    )
    for label, rows in loaded.items():
        ok = [r for r in rows if r["status"] == "succeeded"]
        total = [r["total_ms"] for r in ok if r["total_ms"] is not None]
        ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]

        def three(v: list[float]) -> str:
            return " / ".join(f"{quantile(v, q / 100):.0f}" for q in (50, 95, 99)) if v else "n/a"

        print(f"| {label} | {len(rows)} | {len(ok)} | {three(total)} | {three(ttft)} |")


if __name__ == "__main__":
    main()
