"""Service throughput with grounding on against off, side by side on one host: the demo pair.

    python -m benchmarks.grounding_throughput --out runs/grounding_throughput.json

The held-out questions of ``benchmarks.instruct_goals`` (30 by default) are queued at once on
one live worker (Redis, PostgreSQL, the shipped pair, the demo corpus ingested once, as a
deployment with grounding on ingests it: with each chunk's grounding vectors), first with
grounding off, then with a fresh worker with grounding on (its scorer starts with no passage
kept in memory). Per run: queries per second from the first query queued to the last one ``succeeded``
(what the service's throughput is), and with grounding on also to the last grounding stored (the
grounding thread may still work after the last answer). Answers are compared question by
question: grounding must not change them.

Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server`` (a private one is started).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.grounding_goals import demo_deployment, submit
from benchmarks.instruct_goals import held_out_questions
from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "grounding",
        "Demo pair, held-out questions queued at once on one worker: throughput with grounding on "
        "against off (within 5%)",
        "throughput_on_pct",
        ">=",
        95.0,
        "%",
    ),
    goal(
        "grounding",
        "Demo pair, the same queries: answers identical with grounding on and off",
        "identical_answers",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both runs' timings and answers, on one deployment (grounding_goals.demo_deployment)."""
    questions = [q["question"] for q in held_out_questions(args.questions)]
    out: dict[str, Any] = {}
    with demo_deployment(args, work, grounding=True) as (base, factory, tenant):
        for mode in ("off", "on"):
            settings = base.model_copy(update={"grounding": mode == "on"})
            out[mode] = one_run(mode, settings, factory, tenant, questions, args, work)
    return out


def one_run(
    mode: str,
    settings: Any,
    factory: Any,
    tenant: Any,
    questions: list[str],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    """One worker with ``settings``: the questions queued at once, timed to the last answer."""
    from sqlalchemy import func, select

    from app.db import AnswerGrounding, Query
    from workers import create_celery
    from workers.process import WorkerProcess, settings_env

    worker = WorkerProcess(settings_env(settings), work / f"worker-{mode}.log",
                           name=f"throughput-{mode}", cwd=ROOT).start()  # fmt: skip
    try:
        worker.wait_ready(timeout=900)
        celery = create_celery(settings)

        def ask(question: str) -> Any:
            return submit(settings, factory, tenant, celery, question, args)

        def count(ids: list[Any], grounded: bool) -> int:
            with factory() as session:
                if grounded:
                    stmt = select(func.count()).select_from(AnswerGrounding).where(
                        AnswerGrounding.query_id.in_(ids))  # fmt: skip
                else:
                    stmt = select(func.count()).select_from(Query).where(
                        Query.id.in_(ids), Query.status.in_(("queued", "running")))  # fmt: skip
                return int(session.scalar(stmt) or 0)

        warm = [ask(f"{questions[0]} (warm-up {mode})")]
        while count(warm, grounded=False):
            time.sleep(0.05)
        ids = [ask(q) for q in questions]
        deadline = time.monotonic() + 1800
        while count(ids, grounded=False) or (mode == "on" and count(ids, True) < len(ids)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"grounding {mode}: queries or groundings still open")
            time.sleep(0.05)
        with factory() as session:
            rows = session.scalars(select(Query).where(Query.id.in_(ids))).all()
            first = min(r.queued_at for r in rows)
            last = max(r.done_at or r.queued_at for r in rows)
            answers = {r.question: (r.answer.text if r.answer else None) for r in rows}
            stored = session.scalars(
                select(AnswerGrounding.created_at).where(AnswerGrounding.query_id.in_(ids))
            ).all()
            return {
                "queries": len(ids),
                "statuses": sorted({str(r.status) for r in rows}),
                "span_s": (last - first).total_seconds(),
                "grounded": len(stored),
                "span_to_last_grounding_s": (max(stored) - first).total_seconds()
                if stored
                else None,
                "answers": answers,
            }
    finally:
        worker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--method", default="draft_model")
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/grounding_throughput.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="grounding-throughput-") as tmp:
        r = run(args, Path(tmp))
    off, on = r["off"], r["on"]
    qps_off, qps_on = off["queries"] / off["span_s"], on["queries"] / on["span_s"]
    same = sum(on["answers"][q] == off["answers"][q] for q in off["answers"])
    figures = {
        "queries": off["queries"],
        "queries_per_s_off": round(qps_off, 3),
        "queries_per_s_on": round(qps_on, 3),
        "throughput_on_pct": round(100 * qps_on / qps_off, 1),
        "queries_per_s_on_to_last_grounding": round(
            on["queries"] / on["span_to_last_grounding_s"], 3
        )
        if on["span_to_last_grounding_s"]
        else None,
        "grounded_on": on["grounded"],
        "identical_answers": same == len(off["answers"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"figures": figures, "runs": r}, indent=2, default=str) + "\n")
    print(json.dumps(figures, indent=2))
    notes = {
        "throughput_on_pct": f"{qps_on:.3f} queries/s on, {qps_off:.3f} off, {off['queries']} "
        f"queries; to the last grounding stored: "
        f"{figures['queries_per_s_on_to_last_grounding']} queries/s",
        "identical_answers": f"{same} of {len(off['answers'])} answers identical",
    }
    write_result("grounding_throughput", figures, GOALS, notes)


if __name__ == "__main__":
    main()
