"""How a batch's answers compare with the answers they re-ran: JSON, CSV and HTML.

Each item is put in one class: ``identical`` / ``changed`` (both answered; same text or not),
``newly_failed`` (the original was answered, the re-run failed), ``fixed`` (the reverse),
``still_failed``, or, for items with no original (JSONL and golden batches), ``answered`` /
``failed``; ``pending`` and ``cancelled`` items are counted as such. Latency, acceptance and
groundedness (docs/grounding.md: item by item, and the mean of each side) are compared over the
items answered both times, so that before and after describe the same questions.
Latency is the service time (``total_ms - queue_ms``): a batch item's queue time is the batch's
wait, which says nothing about the model.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased, selectinload

from app.audit.render import Section, html_report
from app.audit.render import to_csv as rows_to_csv
from app.audit.stats import quantile
from app.batch.records import Batch, BatchItem
from app.batch.views import batch_view
from app.db.models import Answer, Query

CLASSES = (
    "identical",
    "changed",
    "newly_failed",
    "fixed",
    "still_failed",
    "answered",
    "failed",
    "pending",
    "cancelled",
)
CSV_FIELDS = (
    "position",
    "class",
    "status",
    "query_id",
    "original_query_id",
    "original_status",
    "service_ms_before",
    "service_ms_after",
    "acceptance_before",
    "acceptance_after",
    "groundedness_before",
    "groundedness_after",
    "source_hit",
    "answer_before",
    "answer_after",
)


def _classify(item_status: str, new: Query | None, old: Query | None) -> str:
    if item_status in ("pending", "running") or new is None:
        return "cancelled" if item_status == "cancelled" else "pending"
    if old is None:
        return "answered" if new.status == "succeeded" else "failed"
    ok_new, ok_old = new.status == "succeeded", old.status == "succeeded"
    if ok_new and ok_old:
        same = (new.answer.text if new.answer else None) == (
            old.answer.text if old.answer else None
        )
        return "identical" if same else "changed"
    if ok_old:
        return "newly_failed"
    return "fixed" if ok_new else "still_failed"


def _service_ms(query: Query | None) -> float | None:
    stats = query.stats if query is not None else None
    if stats is None or stats.total_ms is None:
        return None
    return float(stats.total_ms - (stats.queue_ms or 0.0))


def _pct(values: list[float], q: float) -> float | None:
    # The project's one percentile rule (app/audit/stats.quantile), rounded for the report.
    value = quantile(values, q / 100.0)
    return None if value is None else round(value, 3)


def _groundedness(query: Query | None) -> float | None:
    # Query.grounding: app/db/groundings.py (None until grounded, or grounding off).
    grounding = getattr(query, "grounding", None) if query is not None else None
    return None if grounding is None else grounding.groundedness


def _side(queries: list[Query]) -> dict[str, Any]:
    stats = [q.stats for q in queries if q.stats is not None]
    service = [v for v in (_service_ms(q) for q in queries) if v is not None]
    gen = [float(s.generation_ms) for s in stats if s.generation_ms is not None]
    drafted = sum(s.num_draft_tokens for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    drafts = sum(s.num_drafts for s in stats)
    answers = [q.answer for q in queries if q.answer is not None]
    return {
        "n": len(queries),
        "service_ms": {"p50": _pct(service, 50), "p95": _pct(service, 95)},
        "generation_ms": {"p50": _pct(gen, 50), "p95": _pct(gen, 95)},
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "model_pairs": sorted({a.model_pair for a in answers}),
        "index_versions": sorted({a.index_version for a in answers if a.index_version is not None}),
        "groundedness": _mean([_groundedness(q) for q in queries]),
    }


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def build_report(session: Session, batch: Batch) -> dict[str, Any]:
    """The report as a JSON-ready dict: batch view, class counts, before/after, per-item rows."""
    new_q, old_q = aliased(Query), aliased(Query)
    loads = (
        selectinload(Query.answer).selectinload(Answer.sources),
        selectinload(Query.stats),
        selectinload(Query.grounding),  # type: ignore[attr-defined]
    )
    rows = session.execute(
        select(BatchItem, new_q, old_q)
        .outerjoin(new_q, new_q.id == BatchItem.query_id)
        .outerjoin(old_q, old_q.id == BatchItem.original_query_id)
        .where(BatchItem.batch_id == batch.id)
        .order_by(BatchItem.position)
    ).all()
    # Answers, sources and stats of every query involved, in a few bulk selects (not per row).
    ids = {q.id for _, n, o in rows for q in (n, o) if q is not None}
    if ids:
        session.scalars(select(Query).where(Query.id.in_(ids)).options(*loads)).all()
    counts = dict.fromkeys(CLASSES, 0)
    items, before, after = [], [], []
    hits = [0, 0]
    for item, new, old in rows:
        cls = _classify(item.status, new, old)
        counts[cls] += 1
        if new is not None and old is not None and new.stats and old.stats:
            before.append(old)
            after.append(new)
        hit = None
        if item.expected_source and new is not None and new.answer is not None:
            hit = any(s.document.endswith(item.expected_source) for s in new.answer.sources)
            hits[0] += int(hit)
            hits[1] += 1
        items.append(_item_row(item, cls, new, old, hit))
    return {
        "batch": batch_view(batch),
        "counts": counts,
        "compared": len(before),
        "before": _side(before),
        "after": _side(after) if before else _side([n for _, n, _ in rows if n and n.stats]),
        "source_hit_rate": round(hits[0] / hits[1], 4) if hits[1] else None,
        "items": items,
    }


def _item_row(
    item: BatchItem, cls: str, new: Query | None, old: Query | None, hit: bool | None
) -> dict[str, Any]:
    def acc(q: Query | None) -> float | None:
        return q.stats.acceptance_rate if q is not None and q.stats is not None else None

    return {
        "position": item.position,
        "class": cls,
        "status": item.status,
        "query_id": str(item.query_id) if item.query_id else None,
        "original_query_id": str(item.original_query_id) if item.original_query_id else None,
        "original_status": old.status if old is not None else None,
        "service_ms_before": _service_ms(old),
        "service_ms_after": _service_ms(new),
        "acceptance_before": acc(old),
        "acceptance_after": acc(new),
        "groundedness_before": _groundedness(old),
        "groundedness_after": _groundedness(new),
        "source_hit": hit,
        "answer_before": old.answer.text if old is not None and old.answer else None,
        "answer_after": new.answer.text if new is not None and new.answer else None,
    }


def to_csv(report: dict[str, Any]) -> str:
    """One row per item (the CSV_FIELDS columns), written by app/audit's CSV renderer."""

    return rows_to_csv(report["items"], CSV_FIELDS)


def _figures(report: dict[str, Any]) -> tuple[Any, Any]:
    """(answer classes bar chart, per-item service time before vs after scatter)."""
    from matplotlib.figure import Figure  # heavy: matplotlib

    classes = Figure(figsize=(8.0, 3.0))
    ax = classes.subplots()
    names = [k for k, v in report["counts"].items() if v]
    ax.bar(names, [report["counts"][k] for k in names], color="#4477aa")
    ax.set_ylabel("items")
    ax.set_title("How the answers changed")
    scatter = Figure(figsize=(5.0, 4.0))
    ax = scatter.subplots()
    pairs = [
        (r["service_ms_before"], r["service_ms_after"])
        for r in report["items"]
        if r["service_ms_before"] is not None and r["service_ms_after"] is not None
    ]
    if pairs:
        xs, ys = zip(*pairs, strict=True)
        ax.scatter(xs, ys, s=8)
        top = max(max(xs), max(ys))
        ax.plot([0, top], [0, top], color="#999", lw=1)  # on the line: unchanged
    ax.set_xlabel("service ms before")
    ax.set_ylabel("service ms after")
    ax.set_title("Service time per item (below the line: faster)")
    return classes, scatter


def to_html(report: dict[str, Any]) -> str:
    """A self-contained page from app/audit's HTML renderer: summary, changes, before/after,
    items, with a chart of the answer classes and a before/after service-time scatter."""

    b = report["batch"]
    summary = [{"field": k, "value": v} for k, v in b.items() if not isinstance(v, dict)]
    metrics = []
    for label, path in (
        ("service p50 ms", ("service_ms", "p50")),
        ("service p95 ms", ("service_ms", "p95")),
        ("generation p50 ms", ("generation_ms", "p50")),
        ("generation p95 ms", ("generation_ms", "p95")),
        ("acceptance rate", ("acceptance_rate",)),
        ("mean acceptance length", ("mean_acceptance_length",)),
        ("model pairs", ("model_pairs",)),
        ("index versions", ("index_versions",)),
    ):
        row: dict[str, Any] = {"metric": label}
        for side in ("before", "after"):
            value: Any = report[side]
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            row[side] = value
        metrics.append(row)
    classes, scatter = _figures(report)
    sections = [
        Section("Batch", columns=("field", "value"), rows=summary),
        Section(
            "Answers",
            text="identical / changed: answered both times; newly_failed, fixed, still_failed:"
            " compared with the original; answered / failed: no original.",
            columns=("class", "items"),
            rows=[{"class": k, "items": v} for k, v in report["counts"].items()],
            figures=[(classes, "answer classes")],
        ),
        Section(
            "Before / after",
            text=f"Over the {report['compared']} items answered both times; service time is"
            " total_ms - queue_ms.",
            columns=("metric", "before", "after"),
            rows=metrics,
            figures=[(scatter, "service time per item, before vs after")]
            if report["compared"]
            else [],
        ),
        Section("Items", columns=CSV_FIELDS, rows=report["items"]),
    ]
    return html_report(f"specrag batch {b['id']}", sections)


def render(session: Session, batch_id: uuid.UUID, fmt: str) -> tuple[str, str]:
    """(media type, body) of the batch's report in ``fmt`` (json, csv or html)."""
    batch = session.get(Batch, batch_id)
    if batch is None:
        raise LookupError(f"no batch {batch_id}")
    report = build_report(session, batch)
    if fmt == "json":
        return "application/json", json.dumps(report, default=str)
    if fmt == "csv":
        return "text/csv", to_csv(report)
    if fmt == "html":
        return "text/html", to_html(report)
    raise ValueError(f"format: must be json, csv or html, got {fmt!r}")
