"""Grounding through a live worker on the demo pair: held-out 30, sources shown and its cost.

    python -m benchmarks.grounding_goals --out runs/grounding_goals.json

The held-out 30 of ``benchmarks.instruct_goals`` (questions about demo topics the pair never
trained on, each with the verbatim sentence that answers it), asked once each through one live
worker (Redis, PostgreSQL, the shipped pair, grounding on), waiting for each answer's grounding.
Reported from the stored answers:

- ``retrieved``: questions whose retrieved passages include one holding the answer (its first
  six words, as instruct_goals reads it);
- ``shown``: of those, questions where the supporting sources shown for the answer (the union of
  its sentences' ``supported_by``) include such a passage; ``cited``: where the model's own
  markers do (``instruct_goals.cites_answer``, strict), for comparison;
- grounding time against generation time: p50 of each and the p50 of their per-answer ratio.

Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server`` (a private one is started).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.instruct_goals import cites_answer, held_out_questions, holds_quote
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
        "grounding",
        "Demo pair, held-out 30 through a worker: sources shown include a passage holding the "
        "answer whenever retrieval handed one (>= 21 of 22)",
        "shown_pct",
        ">=",
        95.0,
        "%",
    ),
    goal(
        "grounding",
        "Demo pair, held-out 30 through a worker: grounding time / generation time per answer, p50",
        "ratio_p50_pct",
        "<=",
        5.0,
        "%",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """One answer's verdicts: retrieved / shown / cited hold the answer, and the timings."""
    view, quote = row["view"], row["quote"]
    sources = view.get("sources") or []
    holding = {j for j, s in enumerate(sources) if holds_quote(s["text"], quote)}
    grounding = view.get("grounding") or {}
    shown = {j for s in grounding.get("sentences") or [] for j in s["supported_by"]}
    return {
        "question": row["question"],
        "retrieved": bool(holding),
        "shown": bool(holding & shown),
        "cited": cites_answer(view.get("answer") or "", sources, row["file"], quote)[1],
        "groundedness": grounding.get("groundedness"),
        "reason": grounding.get("reason"),
        "grounding_ms": grounding.get("grounding_ms"),
        "generation_ms": (view.get("stats") or {}).get("generation_ms"),
    }


@contextmanager
def demo_deployment(
    args: argparse.Namespace, work: Path, **update: Any
) -> Iterator[tuple[Any, Any, Any]]:
    """A deployment of its own for the demo pair: a new PostgreSQL database, a private Redis and
    the demo corpus ingested for tenant ``bench``; yields its workers' settings (``update`` on
    top), its session factory and the tenant. Everything is dropped after."""
    from app.db import make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.lifecycle.queries import get_or_create_tenant
    from app.resources import Resources
    from app.settings import Settings

    dbname = create_database()
    redis = RedisServer(work)
    redis.start()
    try:
        settings = Settings(
            data_dir=work / "data", database_url=database_url(dbname), broker_url=redis.url(0),
            target_model=Path(args.models) / "target", draft_model=Path(args.models) / "draft",
            device="cpu", torch_threads=1, worker_concurrency=1,
            max_tokens_limit=args.max_tokens, default_top_k=args.top_k, **update,
        )  # fmt: skip
        engine = make_engine(settings)
        upgrade(engine)
        factory = make_session_factory(engine)
        corpus = sorted((ROOT / "demo" / "corpus").glob("*.md"))
        report = Resources(settings, factory).retrieval.ingest(
            corpus, collection="demo", tenant="bench"
        )
        print(f"ingest: {report.seconds:.1f} s, grounding vectors stored: {settings.grounding}",
              flush=True)  # fmt: skip
        with factory() as session:
            tenant = get_or_create_tenant(session, "bench")
        yield settings, factory, tenant
        engine.dispose()
    finally:
        redis.stop()
        drop_database(dbname)


def submit(
    settings: Any, factory: Any, tenant: Any, celery: Any, question: str, args: argparse.Namespace
) -> Any:
    """Store ``question`` for ``tenant`` (the benchmark's method, k=4) and queue it; its id."""
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, validate_request
    from workers import send_query

    request = validate_request(settings, {
        "question": question, "collection": "demo", "max_tokens": args.max_tokens,
        "method": args.method, "num_speculative_tokens": 4,
    })  # fmt: skip
    with factory() as session:
        query, _ = create_query(session, tenant, request, source="benchmark")
    send_and_mark(factory, query.id, "answer", lambda q, queue: send_query(celery, q, queue))
    return query.id


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Ask the held-out questions through a live worker; each row's view carries its grounding."""
    from app.grounding import wait_for_grounding
    from app.lifecycle.queries import query_view
    from workers import create_celery
    from workers.process import WorkerProcess, settings_env

    questions = held_out_questions(args.questions)
    rows = []
    with demo_deployment(args, work, grounding=True) as (settings, factory, tenant):
        worker = WorkerProcess(settings_env(settings), work / "worker.log", name="grounding",
                               cwd=ROOT).start()  # fmt: skip
        try:
            worker.wait_ready(timeout=900)
            celery = create_celery(settings)

            def ask(question: str) -> dict[str, Any]:
                query_id = submit(settings, factory, tenant, celery, question, args)
                deadline = time.monotonic() + 900
                while time.monotonic() < deadline:
                    found = wait_for_grounding(factory, query_id, timeout=0)
                    if found.status == "failed" or getattr(found, "grounding", None) is not None:
                        return json.loads(json.dumps(query_view(found), default=str))
                    time.sleep(0.1)
                raise TimeoutError(f"query {query_id} still open")

            ask(f"{questions[0]['question']} (warm-up)")
            for i, q in enumerate(questions):
                rows.append({**q, "view": ask(q["question"])})
                print(f"[{time.strftime('%H:%M:%S')}] {i + 1}/{len(questions)}", flush=True)
        finally:
            worker.stop()
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal figures over the judged answers."""
    judged = [judge(r) for r in rows]
    retrieved = [j for j in judged if j["retrieved"]]
    timed = [j for j in judged if j["grounding_ms"] is not None and j["generation_ms"]]
    g_ms = [float(j["grounding_ms"]) for j in timed]
    gen_ms = [float(j["generation_ms"]) for j in timed]
    return {
        "questions": len(judged),
        "retrieved": len(retrieved),
        "shown": sum(j["shown"] for j in retrieved),
        "cited": sum(j["cited"] for j in retrieved),
        "grounding_ms_p50": statistics.median(g_ms) if g_ms else None,
        "generation_ms_p50": statistics.median(gen_ms) if gen_ms else None,
        "ratio_p50": statistics.median(g / t for g, t in zip(g_ms, gen_ms, strict=True))
        if timed
        else None,
        "groundedness_mean": statistics.fmean(
            j["groundedness"] for j in judged if j["groundedness"] is not None
        )
        if any(j["groundedness"] is not None for j in judged)
        else None,
        "host": {"machine": platform.machine(), "processor": platform.processor()},
        # With what was judged (answer, sources, grounding), so a miss can be read afterwards.
        "answers": [
            {**j, "quote": r["quote"], "view": r["view"]} for j, r in zip(judged, rows, strict=True)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--method", default="draft_model")
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the per-answer JSON (default runs/grounding_goals.json); the goals' figures always "
        "go to benchmarks/results/grounding_goals.json",
    )
    ap.add_argument(
        "--stages",
        action="store_true",
        help="time one grounding call stage by stage instead (benchmarks/grounding_stages.py)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="with --stages: groundings per answer")
    ap.add_argument(
        "--compare-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="with --stages: also ground with the claims in this dtype, side by side",
    )
    args = ap.parse_args()
    if args.stages:
        from benchmarks.grounding_stages import run_stages

        args.out = args.out or Path("runs/grounding_stages.json")
        run_stages(args)
        return
    args.out = args.out or Path("runs/grounding_goals.json")
    with tempfile.TemporaryDirectory(prefix="grounding-goals-") as tmp:
        result = summarise(run(args, Path(tmp)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "answers"}, indent=2))
    figures = {k: v for k, v in result.items() if k not in ("answers", "host")}
    figures["shown_pct"] = (
        round(100 * result["shown"] / result["retrieved"], 1) if result["retrieved"] else None
    )
    ratio = result["ratio_p50"]
    figures["ratio_p50_pct"] = None if ratio is None else round(100 * ratio, 2)
    notes = {
        "shown_pct": f"{result['shown']} of {result['retrieved']} retrieved; the model's own "
        f"markers: {result['cited']}",
        "ratio_p50_pct": f"grounding p50 {_ms(result['grounding_ms_p50'])}, generation p50 "
        f"{_ms(result['generation_ms_p50'])}",
    }
    write_result("grounding_goals", figures, GOALS, notes)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


if __name__ == "__main__":
    main()
