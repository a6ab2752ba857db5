"""Golden evaluations: answer a labelled set with speculation and without, score, store, compare.

Each item is asked twice through ``app.pipeline`` in this process (no queue): with the requested
speculation method, then greedily with method ``none`` (the baseline). Both queries are stored
like any other but on the ``eval`` queue, which the outbox never sends and the audit report does
not count as traffic. Decoding is greedy, so the two answers must be identical.
"""

from __future__ import annotations

import json
import statistics
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.audit.aggregate import EVAL_QUEUE
from app.audit.records import GoldenItem, GoldenRun
from app.db.models import Answer, Query, utcnow
from app.lifecycle.queries import get_or_create_tenant
from app.pipeline import answer_query
from app.requests import DEFAULT_NUM_SPECULATIVE_TOKENS, Method, validate_request
from app.scoring import exact_match, faithfulness, retrieval_recall, token_f1
from app.tracing import current_traceparent, links_to, span

REFERENCE_KEYS = ("reference", "reference_answer", "answer")


@dataclass(frozen=True)
class GoldenSpec:
    """One line of a golden file."""

    line_no: int
    question: str
    collection: str
    reference: str
    expected_sources: list[str] = field(default_factory=list)


def _parse_line(data: Any, default_collection: str | None) -> GoldenSpec | str:
    if not isinstance(data, dict):
        return "not a JSON object"
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        return "needs a non-empty string 'question'"
    collection = data.get("collection") or default_collection
    if not isinstance(collection, str) or not collection.strip():
        return "needs a 'collection' (or pass --collection)"
    reference = next((data[k] for k in REFERENCE_KEYS if k in data), None)
    if not isinstance(reference, str):
        return "needs a string 'reference' (the reference answer)"
    expected = data.get("expected_sources", data.get("expected_source", []))
    if isinstance(expected, str):
        expected = [expected]
    if not isinstance(expected, list) or not all(isinstance(e, str) and e for e in expected):
        return "'expected_sources' must be a list of non-empty strings"
    return GoldenSpec(0, question, collection.strip(), reference, list(expected))


def read_golden(path: Path, default_collection: str | None = None) -> list[GoldenSpec]:
    """The items of a golden JSONL file; ValueError naming every malformed line (up to five)."""
    items: list[GoldenSpec] = []
    problems: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            parsed = _parse_line(json.loads(line), default_collection)
        except json.JSONDecodeError as exc:
            parsed = f"not JSON ({exc.msg})"
        if isinstance(parsed, str):
            problems.append(f"line {number}: {parsed}")
        else:
            items.append(replace(parsed, line_no=number))
    if problems:
        raise ValueError(f"{path}: {len(problems)} malformed line(s): " + "; ".join(problems[:5]))
    if not items:
        raise ValueError(f"{path}: no golden items")
    return items


@dataclass
class Answered:
    """What one pipeline run of a golden question produced."""

    query_id: uuid.UUID
    text: str | None
    documents: list[str]
    passages: list[str]
    total_ms: float | None
    generation_ms: float | None
    error: str | None


def _ask(resources: Any, tenant: Any, spec: GoldenSpec, params: dict[str, Any]) -> Answered:

    request = validate_request(
        resources.settings, {"question": spec.question, "collection": spec.collection, **params}
    )
    qid = uuid.uuid4()
    sf = resources.session_factory
    with sf() as session:
        # enqueued_at set: the query is handed to this process, so the outbox never sends it.
        session.add(
            Query(id=qid, tenant_id=tenant.id, collection=request.collection,
                  question=request.question, params=request.params(), status="queued",
                  queue=EVAL_QUEUE, source="golden", attempts=0, enqueued_at=utcnow())
        )  # fmt: skip
        session.commit()
    answer_query(resources, qid)
    with sf() as session:
        query = session.scalars(
            select(Query)
            .where(Query.id == qid)
            .options(selectinload(Query.answer).selectinload(Answer.sources))
            .options(selectinload(Query.stats))
        ).one()
        answer, stats = query.answer, query.stats
        return Answered(
            qid,
            answer.text if answer else None,
            [s.document for s in answer.sources] if answer else [],
            [s.text for s in answer.sources] if answer else [],
            stats.total_ms if stats else None,
            stats.generation_ms if stats else None,
            query.error if query.status != "succeeded" else None,
        )


def run_golden(
    resources: Any,
    items: list[GoldenSpec],
    *,
    source_file: str,
    tenant: str = "default",
    method: str = Method.DRAFT_MODEL,
    num_speculative_tokens: int | str = DEFAULT_NUM_SPECULATIVE_TOKENS,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """Answer, score and store every item (speculative and baseline); returns the run summary."""

    s = resources.settings
    common = {"temperature": 0.0, "max_tokens": max_tokens or s.default_max_tokens}
    spec_params = {**common, "method": method, "num_speculative_tokens": num_speculative_tokens}
    base_params = {**common, "method": "none"}
    embedder = resources.retrieval.embedder
    # A golden run is a trace of its own; each item's speculative and baseline answers in it.
    run_span = span("golden run", {"specrag.golden.items": len(items)}, root=True)
    with resources.session_factory() as session, run_span:
        owner = get_or_create_tenant(session, tenant)
        run = GoldenRun(
            id=uuid.uuid4(), source_file=source_file, tenant=tenant, method=method,
            num_speculative_tokens=str(num_speculative_tokens), num_items=len(items),
            model_pair=getattr(resources.engine, "model_pair", None), summary={},
        )  # fmt: skip
        session.add(run)
        session.commit()
        for spec in items:
            with span("golden speculative", {"specrag.golden.line": spec.line_no}):
                a = _ask(resources, owner, spec, spec_params)
                answered = current_traceparent()
            # The baseline re-decodes what the speculative answer decoded: linked to it.
            with span("golden baseline", {"specrag.golden.line": spec.line_no},
                      links=links_to([answered])):  # fmt: skip
                b = _ask(resources, owner, spec, base_params)
            text, base_text = a.text or "", b.text or ""
            session.add(
                GoldenItem(
                    run_id=run.id, line_no=spec.line_no, question=spec.question,
                    collection=spec.collection, reference=spec.reference,
                    expected_sources=spec.expected_sources, spec_query_id=a.query_id,
                    baseline_query_id=b.query_id, spec_answer=a.text, baseline_answer=b.text,
                    error=a.error or b.error,
                    exact_match=exact_match(text, spec.reference),
                    token_f1=token_f1(text, spec.reference),
                    retrieval_recall=retrieval_recall(spec.expected_sources, a.documents),
                    faithfulness=faithfulness(text, a.passages, embedder, s.faithfulness_threshold),
                    baseline_exact_match=exact_match(base_text, spec.reference),
                    baseline_token_f1=token_f1(base_text, spec.reference),
                    baseline_faithfulness=faithfulness(
                        base_text, b.passages, embedder, s.faithfulness_threshold),
                    identical=a.text is not None and a.text == b.text,
                    spec_total_ms=a.total_ms, baseline_total_ms=b.total_ms,
                    spec_generation_ms=a.generation_ms, baseline_generation_ms=b.generation_ms,
                )
            )  # fmt: skip
            session.commit()
        run.summary = summarize(
            list(session.scalars(select(GoldenItem).where(GoldenItem.run_id == run.id)))
        )
        session.commit()
        return {"run_id": str(run.id), **run.summary}


def _mean(values: list[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _median(values: list[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarize(items: list[GoldenItem]) -> dict[str, Any]:
    """A run's metrics over its items (means; latencies as mean and median ms)."""
    spec_gen = sum(i.spec_generation_ms or 0 for i in items)
    base_gen = sum(i.baseline_generation_ms or 0 for i in items)
    return {
        "items": len(items),
        "errors": sum(i.error is not None for i in items),
        "exact_match": _mean([i.exact_match for i in items]),
        "token_f1": _mean([i.token_f1 for i in items]),
        "retrieval_recall": _mean([i.retrieval_recall for i in items]),
        "faithfulness": _mean([i.faithfulness for i in items]),
        "identical_rate": _mean([i.identical for i in items]),
        "spec_total_ms": {"mean": _mean([i.spec_total_ms for i in items]),
                          "p50": _median([i.spec_total_ms for i in items])},
        "baseline_total_ms": {"mean": _mean([i.baseline_total_ms for i in items]),
                              "p50": _median([i.baseline_total_ms for i in items])},
        "speedup": base_gen / spec_gen if spec_gen > 0 and base_gen > 0 else None,
    }  # fmt: skip


def find_run(session: Session, ref: str) -> GoldenRun:
    """The run whose id is ``ref`` or starts with it; LookupError when none or ambiguous."""
    text = ref.strip().lower()
    runs = [r for r in session.scalars(select(GoldenRun)) if str(r.id).startswith(text)]
    if len(runs) != 1:
        what = "no golden run" if not runs else f"{len(runs)} golden runs"
        raise LookupError(f"{what} with id {ref!r} (see `specrag eval golden`)")
    return runs[0]


COMPARED = ("exact_match", "token_f1", "retrieval_recall", "faithfulness", "identical_rate",
            "speedup")  # fmt: skip


def compare_runs(session: Session, ref_a: str, ref_b: str) -> dict[str, Any]:
    """Run B against run A: each metric's values and delta, and the items whose scores changed."""
    a, b = find_run(session, ref_a), find_run(session, ref_b)
    metrics = {}
    for name in COMPARED:
        va, vb = a.summary.get(name), b.summary.get(name)
        delta = vb - va if va is not None and vb is not None else None
        metrics[name] = {"a": va, "b": vb, "delta": delta}
    for name in ("spec_total_ms", "baseline_total_ms"):
        va, vb = (a.summary.get(name) or {}).get("p50"), (b.summary.get(name) or {}).get("p50")
        delta = vb - va if va is not None and vb is not None else None
        metrics[f"{name}_p50"] = {"a": va, "b": vb, "delta": delta}
    items_a = {(i.question, i.collection): i for i in _items(session, a.id)}
    changed = []
    for item in _items(session, b.id):
        before = items_a.get((item.question, item.collection))
        if before is None:
            continue
        diff = {
            k: {"a": getattr(before, k), "b": getattr(item, k)}
            for k in ("exact_match", "token_f1", "retrieval_recall", "faithfulness", "identical")
            if getattr(before, k) != getattr(item, k)
        }
        if diff:
            changed.append({"question": item.question, "line_b": item.line_no, **diff})
    return {"run_a": str(a.id), "run_b": str(b.id), "metrics": metrics,
            "common_items": sum((i.question, i.collection) in items_a for i in _items(session, b.id)),
            "changed_items": changed}  # fmt: skip


def _items(session: Session, run_id: uuid.UUID) -> list[GoldenItem]:
    return list(
        session.scalars(
            select(GoldenItem).where(GoldenItem.run_id == run_id).order_by(GoldenItem.line_no)
        )
    )
