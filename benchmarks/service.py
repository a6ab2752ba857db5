"""Service overhead and queue throughput through Redis on loopback, with one live worker.

Overhead is what the service adds around the work: total − retrieval − generation, where total
runs from the query's insert to its recorded answer (queue wait, claim, prompt building,
tokenisation and the database writes included). It is measured on queries submitted one at a time,
so the queue holds nothing else. Throughput: a burst of queued queries on one worker, all of them
answered and none twice.

    .venv/bin/python -m benchmarks.service --sequential 100 --burst 200

Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server`` (a private one is started on a free port).
A tiny random-weight pair keeps generation short; pass --target/--draft for real checkpoints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.support import (
    RedisServer,
    create_database,
    database_url,
    drop_database,
    goal,
    train_tokenizer,
    write_result,
)

GOALS = [
    goal(
        "service",
        "service overhead p50 (total - retrieval - generation)",
        "overhead_p50_ms",
        "<=",
        15,
        "ms",
    ),
    goal("service", "service overhead p95", "overhead_p95_ms", "<=", 40, "ms"),
    goal(
        "service",
        "200 queued queries on one worker all answered, none twice",
        "all_once",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def tiny_pair(out: Path) -> tuple[Path, Path]:
    """A seeded random-weight Llama target (2 layers) and draft (1 layer) with a small BPE."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    train_tokenizer(out / "tok")
    fast = PreTrainedTokenizerFast.from_pretrained(out / "tok")
    dirs = []
    for name, layers in (("target", 2), ("draft", 1)):
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=len(fast),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            eos_token_id=fast.eos_token_id,
            bos_token_id=None,
        )
        LlamaForCausalLM(config).save_pretrained(out / name)
        fast.save_pretrained(out / name)
        dirs.append(out / name)
    return dirs[0], dirs[1]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from sqlalchemy import func, select

    from app.db import Answer, Query, make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from app.resources import Resources
    from app.settings import Settings
    from workers import create_celery, send_query
    from workers.process import WorkerProcess, settings_env

    target, draft = (
        (Path(args.target), Path(args.draft)) if args.target else tiny_pair(work / "models")
    )
    dbname = create_database()
    redis = RedisServer(work)
    redis.start()
    worker = None
    try:
        settings = Settings(
            data_dir=work / "data",
            database_url=database_url(dbname),
            broker_url=redis.url(0),
            target_model=target,
            draft_model=draft,
            device="cpu",
        )
        engine = make_engine(settings)
        upgrade(engine)
        factory = make_session_factory(engine)
        corpus = ROOT / "demo" / "corpus"
        Resources(settings, factory).retrieval.ingest(
            [corpus / n for n in ("assert.md", "pass.md", "del.md")],
            collection="docs",
            tenant="bench",
        )
        worker = WorkerProcess(
            settings_env(settings), work / "worker.log", name="bench", cwd=ROOT
        ).start()
        worker.wait_ready()
        celery = create_celery(settings)
        request = validate_request(
            settings,
            {
                "question": "What does assert do?",
                "collection": "docs",
                "max_tokens": args.max_tokens,
            },
        )
        with factory() as session:
            tenant = get_or_create_tenant(session, "bench")

        def submit() -> uuid.UUID:
            with factory() as session:
                query, _ = create_query(session, tenant, request, source="benchmark")
            send_and_mark(
                factory, query.id, "answer", lambda q, queue: send_query(celery, q, queue)
            )
            return query.id

        def wait(ids: list[uuid.UUID], timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while True:
                with factory() as session:
                    open_ = session.scalar(
                        select(func.count())
                        .select_from(Query)
                        .where(Query.id.in_(ids), Query.status.in_(("queued", "running")))
                    )
                if not open_:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{open_} queries still open")
                time.sleep(0.02)

        for _ in range(args.warmup):
            wait([submit()], 120)
        sequential = []
        for _ in range(args.sequential):
            qid = submit()
            wait([qid], 120)
            sequential.append(qid)

        started = time.monotonic()
        burst = [submit() for _ in range(args.burst)]
        submitted_s = time.monotonic() - started
        wait(burst, 1800)
        with factory() as session:
            rows = session.execute(
                select(Query.queued_at, Query.done_at).where(Query.id.in_(burst))
            ).all()
            span = (max(r.done_at for r in rows) - min(r.queued_at for r in rows)).total_seconds()
            answered = session.scalar(
                select(func.count()).select_from(Answer).where(Answer.query_id.in_(burst))
            )
            succeeded = session.scalar(
                select(func.count())
                .select_from(Query)
                .where(Query.id.in_(burst), Query.status == "succeeded")
            )
            attempts = session.scalars(select(Query.attempts).where(Query.id.in_(burst))).all()
            stats = [
                q.stats.to_dict()
                for q in session.scalars(select(Query).where(Query.id.in_(sequential)))
            ]
        engine.dispose()
    finally:
        if worker is not None:
            worker.stop()
        redis.stop()
        drop_database(dbname)
    overhead = [s["total_ms"] - s["retrieval_ms"] - s["generation_ms"] for s in stats]
    return {
        "overhead": overhead,
        "queue": [s["queue_ms"] for s in stats],
        "retrieval": [s["retrieval_ms"] for s in stats],
        "generation": [s["generation_ms"] for s in stats],
        "total": [s["total_ms"] for s in stats],
        "burst": args.burst,
        "succeeded": succeeded,
        "answers": answered,
        "max_attempts": max(attempts),
        "span_s": span,
        "submit_s": submitted_s,
    }


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=100, help="Queries timed one at a time.")
    parser.add_argument("--burst", type=int, default=200, help="Queries queued at once.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--target", default=None, help="Target checkpoint (default: tiny random pair)."
    )
    parser.add_argument("--draft", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specrag-bench-") as tmp:
        r = run(args, Path(tmp))
    print(
        f"## Service overhead ({len(r['overhead'])} sequential queries, Redis on loopback, 1 worker)\n"
    )
    print("| ms | p50 | p95 | mean |")
    print("|---|---|---|---|")
    for name in ("overhead", "queue", "retrieval", "generation", "total"):
        v = r[name]
        print(
            f"| {name} | {quantile(v, 0.5):.1f} | {quantile(v, 0.95):.1f} | {statistics.fmean(v):.1f} |"
        )
    print(f"\n## Burst: {r['burst']} queued queries, one worker\n")
    print("| submitted | succeeded | answer rows | max attempts | submit s | wall s | queries/s |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {r['burst']} | {r['succeeded']} | {r['answers']} | {r['max_attempts']} | "
        f"{r['submit_s']:.2f} | {r['span_s']:.1f} | {r['burst'] / r['span_s']:.1f} |"
    )
    figures = {
        "overhead_p50_ms": quantile(r["overhead"], 0.5),
        "overhead_p95_ms": quantile(r["overhead"], 0.95),
        "all_once": r["succeeded"] == r["burst"] == r["answers"] and r["max_attempts"] == 1,
        "burst_queries_per_s": r["burst"] / r["span_s"],
        "sequential": len(r["overhead"]),
    }
    notes = {
        "all_once": f"{r['succeeded']} / {r['burst']}, {r['burst'] / r['span_s']:.1f} queries/s"
    }
    write_result("service", figures, GOALS, notes)


if __name__ == "__main__":
    main()
