"""Time the audit report over 100k stored requests (PostgreSQL, with SQLite beside it).

Seeds a fresh database per dialect with bulk inserts (``testkit/seeding.py``): ``--rows``
queries in a one-day window (answers with two sources each, stats, shadow baselines on a few)
plus a fifth as many in the previous day, so the alert queries have something to compare.
Then times ``render_report`` per format (median of ``--repeat`` runs) and prints a table.

    .venv/bin/python -m benchmarks.audit [--rows 100000] [--repeat 3] [--skip-sqlite]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from app.audit import render_report
from app.db.schema import upgrade
from benchmarks.support import goal, scratch_database, write_result
from testkit.seeding import seed

GOALS = [
    goal(
        "audit",
        "audit report over 100k requests on PostgreSQL, JSON",
        "report_json_s",
        "<=",
        5.0,
        "s",
    ),
    goal(
        "audit",
        "audit report over 100k requests on PostgreSQL, HTML",
        "report_html_s",
        "<=",
        5.0,
        "s",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

START = datetime(2026, 6, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def seed_db(engine: Engine, rows: int) -> float:
    """Migrate and seed; returns the seconds it took."""
    t0 = time.perf_counter()
    upgrade(engine)
    seed(engine, rows, start=START, span=DAY, seed=1, shadow_share=0.05, chunk=10_000)
    seed(engine, rows // 5, start=START - DAY, span=DAY, seed=2, chunk=10_000)
    return time.perf_counter() - t0


def time_report(engine: Engine, fmt: str, repeat: int) -> tuple[float, int]:
    """Median seconds of one report in ``fmt`` (fresh session each run), and its size."""
    times, size = [], 0
    for _ in range(repeat):
        with Session(engine) as session:
            t0 = time.perf_counter()
            _, body = render_report(
                session, since=START.isoformat(), until=(START + DAY).isoformat(), fmt=fmt
            )
            times.append(time.perf_counter() - t0)
            size = len(body)
    return statistics.median(times), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-sqlite", action="store_true")
    args = ap.parse_args()

    with scratch_database("specrag_bench_audit", migrate=False) as url:
        seconds = report(args, url)
    figures = {
        "report_json_s": seconds[("postgresql", "json")],
        "report_html_s": seconds[("postgresql", "html")],
        "rows": args.rows,
        "report_s": {f"{dialect} {fmt}": s for (dialect, fmt), s in seconds.items()},
    }
    write_result("audit", figures, GOALS)


def report(args: argparse.Namespace, url: str) -> dict[tuple[str, str], float]:
    """Seed the database at ``url`` (and a SQLite file unless skipped), print the table and
    return the median report seconds by (dialect, format)."""
    seconds: dict[tuple[str, str], float] = {}
    engines = {"postgresql": create_engine(url)}
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_sqlite:
        engines["sqlite"] = create_engine(f"sqlite:///{tmp.name}/audit.db")
    try:
        print(f"rows in window: {args.rows} (+{args.rows // 5} in the previous day)")
        print("| database | seed (s) | format | report (s, median) | bytes |")
        print("|---|---|---|---|---|")
        for dialect, engine in engines.items():
            seeded = seed_db(engine, args.rows)
            if dialect == "postgresql":
                with engine.begin() as conn:
                    conn.exec_driver_sql("ANALYZE")
            for fmt in ("json", "csv", "html"):
                secs, size = time_report(engine, fmt, args.repeat)
                print(f"| {dialect} | {seeded:.1f} | {fmt} | {secs:.2f} | {size} |", flush=True)
                seconds[(dialect, fmt)] = secs
    finally:
        for engine in engines.values():
            engine.dispose()
        tmp.cleanup()
    return seconds


if __name__ == "__main__":
    main()
