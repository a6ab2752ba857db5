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

Per stage the p50 and mean over all calls, in milliseconds. With ``--compare-dtype float32`` every
round grounds each answer twice, once with the claims in the host's grounding dtype and once in
float32 (fresh scorers, their order alternating round by round): the stages of each, and how
their groundings agree sentence by sentence (supported or not, supporting passages, score). Needs PostgreSQL on 127.0.0.1:5432 and
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
    res: Any, factory: Any, ids: list[Any], rounds: int, makers: dict[str, Callable[[], Any]]
) -> tuple[list[dict[str, float]], dict[str, list[dict[str, Any]]]]:
    """Every answer grounded ``rounds`` times by each of ``makers``' scorers (a fresh scorer per
    round and kind; kinds in turn, their order reversed every other round): one timing row per
    call (``kind`` its maker's name), and each kind's last groundings as stored."""
    from sqlalchemy import delete

    from app.db import AnswerGrounding

    calls: list[dict[str, Any]] = []
    last: dict[str, list[dict[str, Any]]] = {}
    kinds = list(makers)
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            with factory() as session:
                session.execute(delete(AnswerGrounding).where(AnswerGrounding.query_id.in_(ids)))
                session.commit()
            calls += [{**row, "kind": kind} for row in _ground_all(factory, ids, makers[kind]())]
            last[kind] = stored_answers(factory, ids)
    return calls, last


def _ground_all(factory: Any, ids: list[Any], scorer: Any) -> list[dict[str, Any]]:
    """Each answer grounded once by ``scorer``, its stages timed; one row per call."""
    from app.grounding import ground_stored

    calls = []
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


def agreement(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """How two kinds' groundings of the same answers agree, sentence by sentence: supported or
    not, the supporting passages, and the largest difference of a sentence's score."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True)
             for x, y in zip(ra["sentences"] or [], rb["sentences"] or [], strict=True)]  # fmt: skip
    return {
        "sentences": len(pairs),
        "same_supported": sum(bool(x["supported_by"]) == bool(y["supported_by"]) for x, y in pairs),
        "same_supported_by": sum(x["supported_by"] == y["supported_by"] for x, y in pairs),
        "max_score_diff": max((abs(x["score"] - y["score"]) for x, y in pairs), default=0.0),
    }


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
    from app.grounding.scorer import claim_dtype, load_scorer
    from app.resources import Resources, apply_torch_threads

    questions = [q["question"] for q in held_out_questions(args.questions)]
    with tempfile.TemporaryDirectory(prefix="grounding-stages-") as tmp:
        with demo_deployment(args, Path(tmp), grounding=True) as (settings, factory, tenant):
            apply_torch_threads(settings)
            res = Resources(settings.model_copy(update={"grounding": False}), factory)
            try:
                ids = answer_all(res, factory, tenant, questions, args)
                embedder = res.retrieval.embedder
                kinds = [settings]
                if args.compare_dtype:
                    kinds.append(
                        settings.model_copy(update={"grounding_dtype": args.compare_dtype})
                    )
                makers = {
                    claim_dtype(k): functools.partial(load_scorer, k, embedder) for k in kinds
                }
                calls, last = ground_rounds(res, factory, ids, args.rounds, makers)
            finally:
                res.close()  # the engine loop's thread would keep the process alive
    first = next(iter(makers))
    result: dict[str, Any] = {
        "calls": len(calls),
        "stages_ms": summarise([c for c in calls if c["kind"] == first]),
        "claim_dtype": first,
    }
    for kind in list(makers)[1:]:
        result[f"stages_ms_{kind}"] = summarise([c for c in calls if c["kind"] == kind])
        result[f"agreement_with_{kind}"] = agreement(last[first], last[kind])
    result |= {"rows": calls, "answers": last[first]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "answers")}, indent=2))
