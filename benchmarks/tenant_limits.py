"""What the per-tenant limits cost a request: the checks alone, per storage, side by side.

Each variant times ``Enforcer.submission`` (rate hit + active-queries count) and the request
guard's body scan on a small query body, 2000 times after a warm-up, and prints p50/p95 in
microseconds. Variants: rates in Redis (the broker) with the counts on PostgreSQL; rates in the
database (no Redis broker: app/tenancy/ratestore.py) on PostgreSQL, and on SQLite (the embedded
default).

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.tenant_limits --n 2000

Needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (a free DB number is claimed as
the test fixtures claim one, and flushed after).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

from app.audit.stats import quantile
from benchmarks.support import (
    claim_redis_db,
    create_database,
    database_url,
    drop_database,
    goal,
    release_redis_db,
    write_result,
)

GOALS = [
    goal(
        "tenants",
        "per-tenant limit checks per request, p50 (Redis rates, PostgreSQL counts)",
        "limits_p50_ms",
        "<=",
        1.0,
        "ms",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def time_variant(name: str, settings, n: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from app.api.body import parse_json
    from app.db import make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.lifecycle.queries import get_or_create_tenant
    from app.tenancy.limits import Enforcer

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings)
    upgrade(engine)
    sf = make_session_factory(engine)
    enforcer = Enforcer(settings, engine)
    body = json.dumps({"question": "How do I rotate an API key?", "collection": "docs"}).encode()
    with sf() as session:
        tenant_id = get_or_create_tenant(session, f"bench-{uuid.uuid4().hex[:6]}").id
        checks, scans = [], []
        for i in range(n + 200):
            t0 = time.perf_counter()
            enforcer.submission(session, tenant_id)
            t1 = time.perf_counter()
            parse_json(body, settings.max_json_depth)  # the guard's body check: parse, scan
            t2 = time.perf_counter()
            if i >= 200:
                checks.append((t1 - t0) * 1e6)
                scans.append((t2 - t1) * 1e6)
    engine.dispose()
    return {
        "variant": name,
        "limits_p50_us": quantile(checks, 0.5),
        "limits_p95_us": quantile(checks, 0.95),
        "guard_p50_us": quantile(scans, 0.5),
        "guard_p95_us": quantile(scans, 0.95),
    }


def main() -> None:
    """Print one row per variant."""
    from app.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    number = claim_redis_db()
    dbname = create_database()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # No rate or quota is reached: every check runs in full and passes.
            common = {"tenant_submissions_per_second": 1e9, "tenant_max_active_queries": 10**9}
            rows.append(time_variant("redis + postgresql", Settings(
                data_dir=Path(tmp) / "pg", broker_url=f"redis://127.0.0.1:6379/{number}",
                database_url=database_url(dbname), **common,
            ), args.n))  # fmt: skip
            rows.append(time_variant("database: postgresql", Settings(
                data_dir=Path(tmp) / "pg-db",
                database_url=database_url(dbname), **common,
            ), args.n))  # fmt: skip
            rows.append(
                time_variant(
                    "database: sqlite", Settings(data_dir=Path(tmp) / "lite", **common), args.n
                )  # fmt: skip
            )
    finally:
        drop_database(dbname)
        release_redis_db(number)
    print(f"n={args.n} per variant (after 200 warm-up calls)")
    print("| variant | limits p50 µs | limits p95 µs | guard scan p50 µs | guard scan p95 µs |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['limits_p50_us']:.0f} | {r['limits_p95_us']:.0f} | "
              f"{r['guard_p50_us']:.1f} | {r['guard_p95_us']:.1f} |")  # fmt: skip
    figures = {"limits_p50_ms": rows[0]["limits_p50_us"] / 1000, "n": args.n, "variants": rows}
    notes = {"limits_p50_ms": f"{rows[2]['limits_p50_us'] / 1000:.3f} ms embedded (SQLite)"}
    write_result("tenant_limits", figures, GOALS, notes)


if __name__ == "__main__":
    main()
