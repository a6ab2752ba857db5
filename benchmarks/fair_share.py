"""Fair share on one worker: another tenant's 5 queries while one tenant's 500 wait, vs idle.

Three variants in one run, one live ``specrag worker`` (solo pool) on a private Redis and a fresh
PostgreSQL database, the tiny random-weight pair:

- idle: the small tenant submits 5 queries at once, nothing else queued;
- flood, admission: the flood tenant submits 500 at once (stored, then admitted as the API does),
  then the small tenant its 5;
- flood, no admission: the same, but every query is sent as soon as it is stored.

Latency is stored → answer recorded (``done_at - queued_at``). The goal: the small
tenant's P95 under the flood within 5x of its idle P95.

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.fair_share --flood 500
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.service import tiny_pair
from benchmarks.support import (
    RedisServer,
    create_database,
    database_url,
    drop_database,
    goal,
    write_result,
)

GOALS = [
    goal(
        "tenants",
        "another tenant's 5 queries under a 500-query flood: P95 / idle P95",
        "flood_p95_vs_idle",
        "<=",
        5.0,
        "x",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """One row per variant: the small tenant's latencies, and how much of the flood was answered."""
    from sqlalchemy import func, select, update

    from app.db import Query, make_engine, make_session_factory, utcnow
    from app.db.schema import upgrade
    from app.lifecycle.outbox import admit, send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from app.resources import Resources
    from app.settings import Settings
    from workers import create_celery
    from workers.dispatcher import send_query
    from workers.process import WorkerProcess, settings_env

    target, draft = tiny_pair(work / "models")
    dbname = create_database()
    redis = RedisServer(work)
    redis.start()
    worker = None
    rows = []
    try:
        settings = Settings(
            data_dir=work / "data",
            database_url=database_url(dbname),
            broker_url=redis.url(0),
            target_model=target,
            draft_model=draft,
            device="cpu",
            torch_threads=1,
            default_max_tokens=args.max_tokens,
        )
        engine = make_engine(settings)
        upgrade(engine)
        sf = make_session_factory(engine)
        corpus = ROOT / "demo" / "corpus"
        resources = Resources(settings, sf)
        for tenant in ("flood", "small"):
            resources.retrieval.ingest([corpus / "assert.md"], collection="docs", tenant=tenant)
        worker = WorkerProcess(
            settings_env(settings),
            work / "worker.log",
            queues="answer,batch",
            name="bench",
            cwd=ROOT,
        ).start()
        worker.wait_ready()
        celery = create_celery(settings)
        request = validate_request(settings, {"question": "What does assert do?",
                                              "collection": "docs"})  # fmt: skip

        def send(qid: uuid.UUID, queue: str) -> None:
            send_query(celery, qid, queue)

        def submit(name: str, n: int, admission: bool) -> list[uuid.UUID]:
            ids = []
            for _ in range(n):
                with sf() as session:
                    tenant = get_or_create_tenant(session, name)
                    query, _ = create_query(session, tenant, request, source="benchmark")
                ids.append(query.id)
                if admission:
                    admit(sf, settings, send, tenant_id=tenant.id)
                else:
                    send_and_mark(sf, query.id, "answer", send)
            return ids

        def wait(ids: list[uuid.UUID]) -> list[float]:
            while True:
                with sf() as session:
                    rows_ = session.execute(
                        select(Query.queued_at, Query.done_at).where(
                            Query.id.in_(ids), Query.status.in_(("succeeded", "failed"))
                        )
                    ).all()
                if len(rows_) == len(ids):
                    return [(d - q).total_seconds() * 1000 for q, d in rows_]
                time.sleep(0.05)

        def drain(flood: list[uuid.UUID]) -> int:
            with sf() as session:
                answered = session.scalar(select(func.count()).select_from(Query).where(
                    Query.id.in_(flood), Query.status == "succeeded"))  # fmt: skip
                session.execute(update(Query).where(Query.id.in_(flood), Query.status == "queued")
                                .values(status="failed", error="bench", done_at=utcnow()))  # fmt: skip
                session.commit()
            wait(flood)
            time.sleep(2)  # the skipped messages of the flood leave the broker
            return int(answered or 0)

        wait(submit("small", 3, True))  # warm-up
        for variant, flood_n, admission in (
            ("idle", 0, True),
            ("flood, admission", args.flood, True),
            ("flood, no admission", args.flood, False),
        ):
            flood = submit("flood", flood_n, admission)
            small = submit("small", 5, admission)
            latencies = wait(small)
            answered = drain(flood) if flood else 0
            rows.append({"variant": variant, "latencies": latencies, "flood_answered": answered})
        engine.dispose()
    finally:
        if worker is not None:
            worker.stop()
        redis.stop()
        drop_database(dbname)
    return rows


def main() -> None:
    """Print the table and write the figures (docs/results.md, "Tenants")."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specrag-bench-") as tmp:
        rows = run(args, Path(tmp))
    idle = quantile(rows[0]["latencies"], 0.95)
    print(f"flood={args.flood}, small tenant 5 queries, one worker, max_tokens={args.max_tokens}")
    print("| variant | small p50 ms | small p95 ms | p95 / idle p95 | flood answered by then |")
    print("|---|---|---|---|---|")
    for r in rows:
        p95 = quantile(r["latencies"], 0.95)
        print(f"| {r['variant']} | {quantile(r['latencies'], 0.5):.0f} | {p95:.0f} | "
              f"{p95 / idle:.2f} | {r['flood_answered']} |")  # fmt: skip
    by = {r["variant"]: quantile(r["latencies"], 0.95) for r in rows}
    figures = {"flood_p95_vs_idle": by["flood, admission"] / idle, "p95_ms_by_variant": by,
               "flood": args.flood}  # fmt: skip
    notes = {"flood_p95_vs_idle": f"{by['flood, no admission'] / idle:.1f}x without admission"}
    write_result("fair_share", figures, GOALS, notes)


if __name__ == "__main__":
    main()
