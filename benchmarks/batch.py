"""Batch benchmark: throughput on one worker vs the pipeline back to back; interactive p95 under load.

Needs PostgreSQL and Redis (scripts/ensure-services.sh). Creates a fresh database, ingests four
demo documents, builds tiny random-weight models unless SPECRAG_TARGET_MODEL/DRAFT_MODEL point at
real ones, and starts ``specrag worker`` subprocesses (solo pool, queues answer,batch).

Phases (one run, side by side, so that machine noise hits all of them):
1. throughput: N questions answered back to back by ``app.pipeline.answer_query`` in this
   process, then the same N questions as a batch on one worker (submit → finished), repeated
   ``--rounds`` times alternating; the ratio of median times is printed.
2. interactive latency: blocks of M interactive queries one after another, alternating between
   an idle worker and the same worker running a batch (with preemption, the default), for
   ``--latency-rounds`` rounds, then one more idle block; ``--all-variants`` adds one block with
   yielding between items only and one with no yielding.  p50/p95 of the service-measured
   ``total_ms`` (queued → answered) and ``queue_ms`` (queued → started: the wait the batch
   causes), and a bootstrap interval of the p95 ratio.

    .venv/bin/python -m benchmarks.batch [--items 16] [--rounds 3] [--interactive 10] [--max-tokens 12]
        [--latency-rounds 4] [--batch-items 300] [--all-variants] [--skip-interactive]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select

from app.audit.stats import quantile
from app.db.schema import upgrade
from benchmarks.support import (
    claim_redis_db,
    create_database,
    database_url,
    drop_database,
    goal,
    note,
    start_worker,
    train_tokenizer,
    write_result,
)

GOALS = [
    goal(
        "batch",
        "batch throughput on one worker / the pipeline back to back",
        "throughput_vs_pipeline",
        ">=",
        0.9,
        "x",
    ),
    goal(
        "batch", "interactive p95 during a batch / idle", "interactive_p95_vs_idle", "<=", 1.1, "x"
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

REPO = Path(__file__).resolve().parent.parent


QUESTIONS = (
    "What exception does a failing assert raise?",
    "How does starred assignment collect the remaining items?",
    "How do I loop over an asynchronous iterator?",
    "Which characters may an identifier contain?",
)
FILES = ("assert.md", "assignment.md", "async.md", "atom-identifiers.md")


def build_models(root: Path) -> dict[str, str]:
    """Tiny random-weight Llama target (4 layers) and draft (1 layer) with a trained BPE tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    train_tokenizer(root / "tok")
    tok = AutoTokenizer.from_pretrained(root / "tok")
    out = {}
    for name, layers in (("target", 4), ("draft", 1)):
        torch.manual_seed(0 if name == "target" else 1)
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            eos_token_id=None,  # random weights would stop at random; measure full lengths
            bos_token_id=None,
        )
        LlamaForCausalLM(cfg).save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = str(root / name)
    return out


def setup(tmp: Path) -> tuple[dict[str, str], str]:
    """(SPECRAG_* environment, name) of a fresh migrated database; ``drop_database(name)`` ends it."""
    name = create_database()
    url = database_url(name)
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    models = {"target": os.environ.get("SPECRAG_TARGET_MODEL", ""), "draft": ""}
    if not models["target"]:
        models = build_models(tmp / "models")
    else:
        models["draft"] = os.environ.get("SPECRAG_DRAFT_MODEL", "")
    env = {
        "SPECRAG_DATA_DIR": str(tmp / "data"),
        "SPECRAG_DATABASE_URL": url,
        "SPECRAG_BROKER_URL": f"redis://127.0.0.1:6379/{claim_redis_db()}",
        "SPECRAG_TARGET_MODEL": models["target"],
        "SPECRAG_DRAFT_MODEL": models["draft"],
        "SPECRAG_DEVICE": "cpu",
        "SPECRAG_BATCH_MAX_CONCURRENCY": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    os.environ.update(env)
    return env, name


def wait_query(sf: Any, qid: uuid.UUID, timeout: float = 300) -> Any:
    """The query once finished (polling)."""
    from app.lifecycle.queries import wait_for

    return wait_for(sf, qid, timeout=timeout, poll=0.02)


def ask(sf: Any, settings: Any, celery: Any, question: str, max_tokens: int) -> uuid.UUID:
    """Store and send one interactive query; returns its id."""
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from workers import send_query

    req = validate_request(
        settings, {"question": question, "collection": "demo", "max_tokens": max_tokens}
    )
    with sf() as session:
        query, _ = create_query(
            session, get_or_create_tenant(session, "default"), req, source="benchmark"
        )
    send_and_mark(sf, query.id, "answer", lambda q, queue: send_query(celery, q, queue))
    return query.id


def submit(sf: Any, settings: Any, celery: Any, n: int, max_tokens: int) -> uuid.UUID:
    """Store and dispatch a batch of ``n`` questions; returns its id."""
    from app.batch import submit as sub
    from app.lifecycle.queries import get_or_create_tenant
    from workers import dispatch_batch as dispatch

    lines = [json.dumps({"question": f"{QUESTIONS[i % 4]} ({i})"}) for i in range(n)]
    with sf() as session:
        tenant = get_or_create_tenant(session, "default")
        specs = sub.parse_jsonl(
            lines, settings, tenant.id, collection="demo", overrides={"max_tokens": max_tokens}
        )
        batch = sub.create_batch(session, settings, tenant, specs, source="jsonl", source_detail={})
    dispatch(celery, batch.id, batch.epoch, batch.lanes)
    return batch.id


def batch_done(sf: Any, batch_id: uuid.UUID) -> bool:
    from app.batch.views import get_batch

    with sf() as session:
        batch = get_batch(session, batch_id, None)
        return batch is not None and batch.finished_at is not None


def answering_seconds(sf: Any, query_ids: list[Any]) -> float:
    """Sum over the queries of started → done: the time spent answering, without orchestration."""
    from app.db import Query

    with sf() as session:
        rows = session.execute(
            select(Query.started_at, Query.done_at).where(Query.id.in_(query_ids))
        ).all()
    return sum((done - started).total_seconds() for started, done in rows)


def batch_seconds(sf: Any, batch_id: uuid.UUID) -> float:
    """Submit (created_at) → finished_at of the batch, as the database recorded them."""
    from app.batch.views import get_batch

    with sf() as session:
        batch = get_batch(session, batch_id, None)
        assert batch is not None and batch.finished_at is not None
        return float((batch.finished_at - batch.created_at).total_seconds())


def batch_query_ids(sf: Any, batch_id: uuid.UUID) -> list[Any]:
    from app.batch import BatchItem

    with sf() as session:
        return list(
            session.scalars(select(BatchItem.query_id).where(BatchItem.batch_id == batch_id))
        )


def back_to_back(
    sf: Any, settings: Any, resources: Any, n: int, max_tokens: int
) -> tuple[float, float]:
    """(wall seconds, answering seconds) for ``n`` stored queries answered one after another here."""
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from app.pipeline import answer_query

    ids = []
    with sf() as session:
        tenant = get_or_create_tenant(session, "default")
        for i in range(n):
            req = validate_request(
                settings,
                {
                    "question": f"{QUESTIONS[i % 4]} ({i})",
                    "collection": "demo",
                    "max_tokens": max_tokens,
                },
            )
            query, _ = create_query(session, tenant, req, queue="batch", source="benchmark")
            ids.append(query.id)
    # Mark them sent so that no worker's outbox sweep takes them meanwhile.
    from sqlalchemy import update

    from app.db import Query, utcnow

    with sf() as session:
        session.execute(update(Query).where(Query.id.in_(ids)).values(enqueued_at=utcnow()))
        session.commit()
    t0 = time.perf_counter()
    for qid in ids:
        answer_query(resources, qid)
    return time.perf_counter() - t0, answering_seconds(sf, ids)


def interactive(
    sf: Any, settings: Any, celery: Any, m: int, max_tokens: int
) -> list[tuple[float, float, float]]:
    """(total_ms, queue_ms, generation_ms) of ``m`` interactive queries asked one by one."""
    from app.db import Query
    from app.db.models import GenerationStatsRecord

    out = []
    for i in range(m):
        qid = ask(sf, settings, celery, QUESTIONS[i % 4], max_tokens)
        wait_query(sf, qid)
        with sf() as session:
            stats = session.query(GenerationStatsRecord).filter_by(query_id=qid).one()
            assert session.get(Query, qid).status == "succeeded"  # type: ignore[union-attr]
            out.append((float(stats.total_ms), float(stats.queue_ms), float(stats.generation_ms)))
        time.sleep(0.05)
    return out


def during_batch(
    sf: Any, settings: Any, celery: Any, args: argparse.Namespace, m: int | None = None
) -> list[tuple[float, float, float]]:
    """``interactive`` while a batch of ``--batch-items`` runs on the worker; then cancel it."""
    from app.batch.runner import cancel

    bid = submit(sf, settings, celery, args.batch_items, args.max_tokens)
    time.sleep(1.0)  # the batch is under way
    out = interactive(sf, settings, celery, m or args.interactive, args.max_tokens)
    if batch_done(sf, bid):
        note("warning: the batch finished before the interactive block did; use more --batch-items")
    cancel(sf, bid)
    while not batch_done(sf, bid):
        time.sleep(0.1)
    return out


VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("during batch: preempt (default)", {}),
    ("during batch: yield between items", {"SPECRAG_BATCH_PREEMPT": "false"}),
    ("during batch: no yield", {"SPECRAG_BATCH_YIELD_TO_INTERACTIVE": "false"}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interactive", type=int, default=10, help="queries per block")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--skip-interactive", action="store_true", help="Throughput only.")
    parser.add_argument(
        "--latency-rounds", type=int, default=4, help="alternating idle / during-batch blocks"
    )
    parser.add_argument("--batch-items", type=int, default=300, help="items of each loaded block")
    parser.add_argument(
        "--all-variants",
        action="store_true",
        help="also measure without preemption and without yielding (one block each, slow)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="specrag-bench-batch-"))
    env, dbname = setup(tmp)
    try:
        run(args, env, tmp)
    finally:
        drop_database(dbname)


def run(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> None:
    """All phases; prints the two tables."""
    from app.db import prepare
    from app.resources import Resources
    from app.settings import Settings
    from workers import create_celery

    settings = Settings()
    if settings.torch_threads:  # the in-process pipeline runs as the worker does
        import torch

        torch.set_num_threads(settings.torch_threads)
    _, sf = prepare(settings)
    resources = Resources(settings, sf)
    resources.retrieval.ingest([REPO / "demo" / "corpus" / f for f in FILES], collection="demo")
    resources.warm()
    celery = create_celery(settings)
    log = tmp / "worker.log"
    worker = start_worker(env, log)
    try:
        wait_query(sf, ask(sf, settings, celery, "warm up", 2), timeout=300)
        back_to_back(sf, settings, resources, 4, args.max_tokens)  # this process warm too
        note("worker warm; throughput rounds")
        # (wall, answering) seconds per round. The machine's speed drifts several-fold within
        # minutes (shared CPU), so besides the wall-clock ratio the robust number is each path's
        # orchestration overhead: the share of wall time not spent answering.
        pipe: list[tuple[float, float]] = []
        queue: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            pipe.append(back_to_back(sf, settings, resources, args.items, args.max_tokens))
            bid = submit(sf, settings, celery, args.items, args.max_tokens)
            while not batch_done(sf, bid):
                time.sleep(0.25)  # coarse: polling must not compete with the worker for CPU
            queue.append((batch_seconds(sf, bid), answering_seconds(sf, batch_query_ids(sf, bid))))
            note(f"pipeline {pipe[-1]}, batch {queue[-1]}")
        if args.skip_interactive:
            ratio = report_throughput(args, pipe, queue)
            figures = {"throughput_vs_pipeline": ratio, "interactive_p95_vs_idle": None}
            write_result("batch", figures, GOALS)
            return
        # Idle and during-batch blocks alternate, so that the machine's drift hits both alike.
        idle: list[tuple[float, float, float]] = []
        lat: dict[str, list[tuple[float, float, float]]] = {VARIANTS[0][0]: []}
        for r in range(args.latency_rounds):
            idle += interactive(sf, settings, celery, args.interactive, args.max_tokens)
            note(f"latency round {r + 1}/{args.latency_rounds}: {VARIANTS[0][0]}")
            lat[VARIANTS[0][0]] += during_batch(sf, settings, celery, args)
        idle += interactive(sf, settings, celery, args.interactive, args.max_tokens)
        for label, extra in VARIANTS[1:] if args.all_variants else ():
            worker.stop()
            worker = start_worker(env, log, **extra)
            wait_query(sf, ask(sf, settings, celery, "warm up", 2), timeout=300)
            note(label)
            # Without yielding, each query waits for the rest of a chunk: fewer, or it takes ages.
            m = max(3, args.interactive // 3) if "no yield" in label else args.interactive
            lat[label] = during_batch(sf, settings, celery, args, m)
    finally:
        worker.stop()

    ratio = report_throughput(args, pipe, queue)
    p95_vs_idle = report_latency(args, idle, list(lat.items()))
    figures = {
        "throughput_vs_pipeline": ratio,
        "interactive_p95_vs_idle": p95_vs_idle[VARIANTS[0][0]],
        "p95_vs_idle_by_variant": p95_vs_idle,
    }
    notes = {"interactive_p95_vs_idle": VARIANTS[0][0]}
    write_result("batch", figures, GOALS, notes)


def report_throughput(
    args: argparse.Namespace, pipe: list[tuple[float, float]], queue: list[tuple[float, float]]
) -> float:
    """The throughput table (medians over rounds); returns batch throughput / pipeline's."""
    p = statistics.median(w for w, _ in pipe)
    q = statistics.median(w for w, _ in queue)
    p_over = statistics.median(1 - a / w for w, a in pipe)
    q_over = statistics.median(1 - a / w for w, a in queue)
    print(
        f"\nthroughput ({args.items} items, max_tokens {args.max_tokens}, median of "
        f"{args.rounds} rounds, alternating)\n"
    )
    print(
        "| path | throughput | wall time | vs pipeline | overhead (wall not answering) |"
        "\n|---|---|---|---|---|"
    )
    print(
        f"| pipeline back to back, in process | {args.items / p:.2f} items/s | {p:.1f} s | 1.00 "
        f"| {p_over:.1%} |"
    )
    print(
        f"| batch on one worker (submit → finished) | {args.items / q:.2f} items/s | {q:.1f} s "
        f"| {p / q:.2f} | {q_over:.1%} |"
    )
    return p / q


def report_latency(
    args: argparse.Namespace,
    idle: list[tuple[float, float, float]],
    lat: list[tuple[str, list[tuple[float, float, float]]]],
) -> dict[str, float]:
    """The interactive latency table; returns each loaded condition's p95 / idle p95."""
    print(
        f"\ninteractive latency (service-measured; {len(idle)} idle queries, {args.interactive}"
        " per loaded condition, a third of that without yield; one after another)\n"
    )
    print(
        "| condition | n | total p50 ms | total p95 ms | p95 vs idle | queue p50 ms | queue p95 ms"
        " | generation p50 ms |\n|---|---|---|---|---|---|---|---|"
    )
    base = quantile([v[0] for v in idle], 0.95)
    intervals = []
    ratios: dict[str, float] = {}
    for label, values in [("idle", idle), *lat]:
        total, waits, gen = ([v[i] for v in values] for i in range(3))
        print(
            f"| {label} | {len(values)} | {quantile(total, 0.5):.0f} | {quantile(total, 0.95):.0f} | "
            f"{quantile(total, 0.95) / base:.2f} | {quantile(waits, 0.5):.0f} | {quantile(waits, 0.95):.0f} | "
            f"{quantile(gen, 0.5):.0f} |"
        )
        if label != "idle":
            ratios[label] = quantile(total, 0.95) / base
            lo, hi = p95_ratio_interval([v[0] for v in idle], total)
            intervals.append(f"{label}: p95 / idle p95 90% bootstrap interval [{lo:.2f}, {hi:.2f}]")
    print("\n" + "\n".join(intervals))
    return ratios


def p95_ratio_interval(
    idle: list[float], loaded: list[float], n: int = 2000
) -> tuple[float, float]:
    """A 90% bootstrap interval of p95(loaded) / p95(idle), resampling each side (seeded)."""
    import random

    rng = random.Random(0)
    ratios = sorted(
        quantile(rng.choices(loaded, k=len(loaded)), 0.95)
        / quantile(rng.choices(idle, k=len(idle)), 0.95)
        for _ in range(n)
    )
    return ratios[int(0.05 * n)], ratios[int(0.95 * n)]


if __name__ == "__main__":
    main()
