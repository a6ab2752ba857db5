"""Where one grounding call's wall time goes, stage by stage: the held-out answers of the demo pair.

    python -m benchmarks.grounding_goals --stages --out runs/grounding_stages.json

(A mode of ``benchmarks.grounding_goals``: it backs no goal and writes only ``--out``.)

The held-out questions of ``benchmarks.instruct_goals`` are answered once in this process (the
demo pair, one torch thread as a worker runs it, grounding off while answering), on a deployment
of its own that ingested the demo corpus with each chunk's grounding vectors (as a deployment with
grounding on does). Then every answer is grounded ``--rounds`` times through
``app.grounding.ground_stored``, the worker's own call, each round with a fresh scorer (no passage
kept in memory, as a fresh worker starts) and the previous round's groundings deleted. The stages
are timed by wrapping the functions that do them:

- ``read``: the session, the check for a stored grounding, the answer and its sources;
- ``vectors``: the stored passage vectors read by chunk id;
- ``split``: the answer split into sentences and claims;
- ``claims``: the claims' vectors (MiniLM, or what stands in for it);
- ``passages``: the passages split into windows and terms (a fresh scorer holds none);
- ``lexical``: containment and the number, name and negation checks;
- ``rest``: what is left of the call (cosines, fusion, the answer's shares);
- ``store``: the grounding stored (insert, commit, read back);
- ``grounding_ms``: what the service stores as the call's time (``vectors`` to ``rest``).

Per stage the p50 and mean over all calls, in milliseconds. Needs PostgreSQL on 127.0.0.1:5432 and
``redis-server`` (a private one is started, unused).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.grounding_goals import demo_deployment
from benchmarks.instruct_goals import held_out_questions

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("read", "vectors", "split", "claims", "passages", "lexical", "rest", "store")


@contextmanager
def timed_stages(clock: dict[str, float]) -> Iterator[None]:
    """Wrap the functions behind each stage so that their time adds up in ``clock`` (ms)."""
    # By module name: ``app.grounding.store`` as an attribute is the package's function.
    store_mod = importlib.import_module("app.grounding.store")
    ground_mod = importlib.import_module("retrieval.grounding.ground")
    scorer_mod = importlib.import_module("retrieval.grounding.scorer")

    def wrap(mod: Any, name: str, stage: str) -> tuple[Any, str, Any]:
        original = getattr(mod, name)

        @functools.wraps(original)
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                clock[stage] += (time.perf_counter() - t0) * 1000.0

        setattr(mod, name, timed)
        return mod, name, original

    targets = [
        (store_mod, "stored_vectors", "vectors"),
        (store_mod, "store", "store"),
        (ground_mod, "split_sentences", "split"),
        (scorer_mod, "encode_sorted", "claims"),
        (scorer_mod, "passage_view", "passages"),
        (scorer_mod, "_evidence", "lexical"),
    ]
    saved = [wrap(m, n, s) for m, n, s in targets]
    try:
        yield
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)


def answer_all(res: Any, factory: Any, tenant: Any, questions: list[str], args: Any) -> list[Any]:
    """Store and answer each question in this process; the query ids."""
    from app.lifecycle.queries import create_query, validate_request
    from app.pipeline import answer_query

    ids = []
    for i, question in enumerate(questions):
        request = validate_request(res.settings, {
            "question": question, "collection": "demo", "max_tokens": args.max_tokens,
            "method": args.method, "num_speculative_tokens": 4,
        })  # fmt: skip
        with factory() as session:
            query, _ = create_query(session, tenant, request, source="benchmark")
        outcome = answer_query(res, query.id, host="bench")
        print(f"[{time.strftime('%H:%M:%S')}] answered {i + 1}/{len(questions)}: {outcome}",
              flush=True)  # fmt: skip
        ids.append(query.id)
    return ids


def ground_rounds(
    res: Any, factory: Any, ids: list[Any], rounds: int, make_scorer: Callable[[], Any]
) -> list[dict[str, float]]:
    """Every answer grounded ``rounds`` times (fresh scorer per round); one timing row per call."""
    from sqlalchemy import delete

    from app.db import AnswerGrounding
    from app.grounding import ground_stored

    calls = []
    for _ in range(rounds):
        with factory() as session:
            session.execute(delete(AnswerGrounding).where(AnswerGrounding.query_id.in_(ids)))
            session.commit()
        scorer = make_scorer()
        for qid in ids:
            clock: dict[str, float] = defaultdict(float)
            with timed_stages(clock):
                t0 = time.perf_counter()
                row = ground_stored(factory, scorer, qid)
                wall = (time.perf_counter() - t0) * 1000.0
            assert row is not None
            inner = sum(clock[s] for s in ("vectors", "split", "claims", "passages", "lexical"))
            clock["rest"] = float(row.grounding_ms) - inner
            clock["read"] = wall - float(row.grounding_ms) - clock["store"]
            clock["grounding_ms"] = float(row.grounding_ms)
            clock["wall_ms"] = wall
            clock["sentences"] = float(row.num_sentences)
            calls.append(dict(clock))
    return calls


def stored_answers(factory: Any, ids: list[Any]) -> list[dict[str, Any]]:
    """Each answer's text, its passages and its grounding, as stored (to read afterwards)."""
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    from app.db import Answer, AnswerGrounding

    out = []
    with factory() as session:
        for qid in ids:
            answer = session.scalar(
                select(Answer).where(Answer.query_id == qid).options(selectinload(Answer.sources))
            )
            row = session.scalar(select(AnswerGrounding).where(AnswerGrounding.query_id == qid))
            out.append({
                "answer": answer.text if answer else None,
                "passages": [s.text for s in answer.sources] if answer else [],
                "sentences": row.sentences if row else None,
            })  # fmt: skip
    return out


def summarise(calls: list[dict[str, float]]) -> dict[str, Any]:
    """Per stage p50 and mean (ms) over the calls."""
    keys = [*STAGES, "grounding_ms", "wall_ms", "sentences"]
    return {
        k: {
            "p50": round(statistics.median(c[k] for c in calls), 3),
            "mean": round(statistics.fmean(c[k] for c in calls), 3),
        }
        for k in keys
    }


def run_stages(args: argparse.Namespace) -> None:
    """Answer, ground ``args.rounds`` times with the stages timed, write ``args.out``."""
    from app.grounding.scorer import load_scorer
    from app.resources import Resources, apply_torch_threads

    questions = [q["question"] for q in held_out_questions(args.questions)]
    with tempfile.TemporaryDirectory(prefix="grounding-stages-") as tmp:
        with demo_deployment(args, Path(tmp), grounding=True) as (settings, factory, tenant):
            apply_torch_threads(settings)
            res = Resources(settings.model_copy(update={"grounding": False}), factory)
            try:
                ids = answer_all(res, factory, tenant, questions, args)
                embedder = res.retrieval.embedder
                calls = ground_rounds(
                    res, factory, ids, args.rounds, lambda: load_scorer(settings, embedder)
                )
                answers = stored_answers(factory, ids)
            finally:
                res.close()  # the engine loop's thread would keep the process alive
    result = {
        "calls": len(calls),
        "stages_ms": summarise(calls),
        "rows": calls,
        "answers": answers,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["stages_ms"], indent=2))
