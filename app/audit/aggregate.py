"""Aggregates over the stored queries of a window, grouped by any of the report's groupings.

One row of ``base`` is one query (``answers`` and ``generation_stats`` are unique per query and
are joined one-to-one; sources are never joined), so one stored answer counts once. Queries
that are not traffic (``queries.source`` other than api, cli and batch: one-shot ``ask --local``
answers, golden evaluations, benchmark runs) are left out; ``base(window, sources)`` selects
them instead, for the report's ``non_traffic`` block.

A grouping is a column of ``base_select`` named in ``window.GROUPINGS``: to add one (a dtype, a
prompt format), select the column here under that name and list it there.

**Net loss.** A speculative request (method other than ``none``, answered, at least one draft)
counts as a *net loss* when it accepted fewer draft tokens than it ran verification rounds:
``num_accepted_tokens < num_drafts``, i.e. fewer than one accepted token per target pass. Each
round costs one target pass plus the proposer's work (k draft passes, or a lookup) and a wider
verification; a round that does not gain at least one accepted token on average does not pay that
overhead back. Where a shadow baseline exists, the *measured* net loss is plainer: the
speculative generation took longer than the greedy non-speculative one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import zip_longest
from typing import Any

from sqlalchemy import (
    Column,
    FromClause,
    Integer,
    MetaData,
    Select,
    String,
    Subquery,
    Table,
    and_,
    case,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from app.audit.records import ShadowRun
from app.audit.sql import percentiles, position_sums
from app.audit.window import Window
from app.db.groundings import AnswerGrounding
from app.db.models import TRAFFIC_SOURCES, Answer, GenerationStatsRecord, Query, Tenant

LATENCY_METRICS = ("queue", "retrieval", "ttft", "generation", "total")
BATCH_SIZE_BUCKETS = ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"))
"""(upper edge, label) of the ``batch_size`` grouping over mean_batch_size; above: "33+"."""
EVAL_QUEUE = "eval"
EXTREMES = {"near_tie_gap_min": min, "near_tie_gap_max": max}
"""``counters`` columns that are a min or a max over rows: across groups, not summed."""


def base(window: Window, sources: Sequence[str] = TRAFFIC_SOURCES) -> Subquery:
    """One row per query of ``sources`` queued in ``window``: tenant, stats, answer, shadow."""
    return base_select(window, sources).subquery("base")


@contextmanager
def materialized(session: Session, window: Window) -> Iterator[Table]:
    """``base(window)`` copied once into a temporary table, dropped when the block ends.

    A report runs a dozen aggregates over the same rows; joining five tables for each of them
    costs more than all the aggregates together, so the join runs once. On PostgreSQL the
    transaction also gets enough ``work_mem`` for its sorts to stay in memory.
    """
    sel = base_select(window)
    cols = [Column(c.name, c.type) for c in sel.selected_columns]
    table = Table(f"audit_base_{uuid.uuid4().hex[:12]}", MetaData(), *cols, prefixes=["TEMPORARY"])
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
        # Compiling these one-off scans costs more than it saves.
        conn.exec_driver_sql("SET LOCAL jit = off")
    table.create(conn)
    try:
        conn.execute(table.insert().from_select([c.name for c in cols], sel))
        if conn.dialect.name == "postgresql":
            # Row counts and widths let the planner hash-aggregate instead of sorting.
            keys = "tenant, collection, method, model_pair, num_speculative_tokens"
            conn.exec_driver_sql(f"ANALYZE {table.name} ({keys})")
        yield table
    finally:
        table.drop(session.connection())


def base_select(window: Window, sources: Sequence[str] = TRAFFIC_SOURCES) -> Select[Any]:
    """The statement behind ``base``: one row per query of ``sources`` queued in the window."""
    q, s, a = Query.__table__, GenerationStatsRecord.__table__, Answer.__table__
    t, sh, g = Tenant.__table__, ShadowRun.__table__, AnswerGrounding.__table__
    method = func.coalesce(s.c.method, Query.params["method"].as_string())
    k = func.coalesce(
        s.c.num_speculative_tokens, cast(Query.params["num_speculative_tokens"].as_string(), String)
    )
    batch = s.c.mean_batch_size
    batch_bucket = case(
        (batch.is_(None), None),
        *((batch < edge + 0.5, label) for edge, label in BATCH_SIZE_BUCKETS),
        else_=f"{BATCH_SIZE_BUCKETS[-1][0] + 1}+",
    )
    chosen_k = case(
        (s.c.mean_chosen_k.is_(None), None),
        else_=cast(cast(func.round(s.c.mean_chosen_k), Integer), String),
    )
    cols = [
        q.c.id.label("query_id"),
        q.c.queued_at,
        q.c.status,
        q.c.source,
        t.c.name.label("tenant"),
        q.c.collection,
        method.label("method"),
        a.c.model_pair,
        a.c.index_version,
        a.c.prompt_tokens,
        k.label("num_speculative_tokens"),
        s.c.id.label("stats_id"),
        s.c.num_output_tokens,
        s.c.num_target_forwards,
        s.c.num_drafts,
        s.c.num_draft_tokens,
        s.c.num_accepted_tokens,
        s.c.accepted_per_position,
        *(s.c[f"{m}_ms"] for m in LATENCY_METRICS),
        s.c.mean_batch_size,
        s.c.mean_chosen_k,
        s.c.num_cached_prompt_tokens,
        s.c.dtype,
        s.c.prompt_format,
        s.c.trace_id,
        batch_bucket.label("batch_size"),
        chosen_k.label("chosen_k"),
        sh.c.status.label("shadow_status"),
        sh.c.baseline_generation_ms,
        sh.c.baseline_ttft_ms,
        sh.c.mismatched_tokens,
        sh.c.dtype.label("shadow_dtype"),
        sh.c.judgment,
        sh.c.divergence_gap,
        g.c.groundedness,
        g.c.citation_precision,
    ]
    stmt = (
        select(*cols)
        .select_from(q)
        .join(t, t.c.id == q.c.tenant_id)
        .outerjoin(s, s.c.query_id == q.c.id)
        .outerjoin(a, a.c.query_id == q.c.id)
        .outerjoin(sh, sh.c.query_id == q.c.id)
        .outerjoin(g, g.c.query_id == q.c.id)
        .where(q.c.queued_at >= window.since, q.c.queued_at < window.until)
        .where(q.c.source.in_(list(sources)))
    )
    return stmt


def _count(cond: Any) -> Any:
    return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)


def _sum(expr: Any, cond: Any) -> Any:
    return func.sum(case((cond, expr)))


def counters(session: Session, b: FromClause, keys: Sequence[str]) -> dict[tuple[Any, ...], dict]:
    """Counts and sums per key tuple: requests, outcomes, tokens, drafts, shadow baselines (and
    the excused near-ties' smallest and largest gap: ``EXTREMES``)."""
    answered = and_(b.c.status == "succeeded", b.c.stats_id.is_not(None))
    timed = and_(answered, b.c.generation_ms > 0)
    spec = and_(answered, b.c.method != "none")
    shadow_done = and_(b.c.shadow_status == "done", b.c.generation_ms > 0)
    shadow_done = and_(shadow_done, b.c.baseline_generation_ms > 0)
    cached_known = b.c.num_cached_prompt_tokens.is_not(None)
    differs, judged = and_(shadow_done, b.c.mismatched_tokens > 0), b.c.judgment
    near_tie = and_(differs, judged == "excused")
    cols = {
        "requests": func.count(),
        "succeeded": _count(b.c.status == "succeeded"),
        "failed": _count(b.c.status == "failed"),
        "in_flight": _count(b.c.status.in_(("queued", "running"))),
        "tokens_timed": _sum(b.c.num_output_tokens, timed),
        "generation_ms_timed": _sum(b.c.generation_ms, timed),
        "output_tokens": _sum(b.c.num_output_tokens, answered),
        "target_forwards": _sum(b.c.num_target_forwards, answered),
        "drafts": _sum(b.c.num_drafts, answered),
        "draft_tokens": _sum(b.c.num_draft_tokens, answered),
        "accepted_tokens": _sum(b.c.num_accepted_tokens, answered),
        "speculative_requests": _count(spec),
        "net_loss": _count(
            and_(spec, b.c.num_drafts > 0, b.c.num_accepted_tokens < b.c.num_drafts)
        ),
        "shadow_samples": _count(shadow_done),
        "shadow_pending": _count(b.c.shadow_status.in_(("pending", "running"))),
        "shadow_failed": _count(b.c.shadow_status == "failed"),
        "shadow_spec_ms": _sum(b.c.generation_ms, shadow_done),
        "shadow_base_ms": _sum(b.c.baseline_generation_ms, shadow_done),
        # A mismatch is a violation unless judged a near-tie or left unjudged (rows from before
        # migration 0017 carry no judgment: float32 workers, every mismatch a violation).
        "exactness_violations": _count(and_(differs, or_(judged.is_(None), judged == "violation"))),
        "near_ties": _count(near_tie),
        "near_tie_gap_min": func.min(case((near_tie, b.c.divergence_gap))),
        "near_tie_gap_max": func.max(case((near_tie, b.c.divergence_gap))),
        "unjudged_mismatches": _count(and_(differs, judged == "unjudged")),
        "mismatched_tokens": func.coalesce(_sum(b.c.mismatched_tokens, shadow_done), 0),
        "measured_loss": _count(and_(shadow_done, b.c.generation_ms > b.c.baseline_generation_ms)),
        "batch_size_sum": _sum(b.c.mean_batch_size, answered),
        "batch_size_n": _count(and_(answered, b.c.mean_batch_size.is_not(None))),
        "chosen_k_sum": _sum(b.c.mean_chosen_k, answered),
        "chosen_k_n": _count(and_(answered, b.c.mean_chosen_k.is_not(None))),
        # vLLM's prefix_cache_queries / _hits: prompt tokens looked up, and found cached. Only
        # answers that recorded the figure (migration 0010 on) count in either.
        "prefix_queries": _sum(b.c.prompt_tokens, and_(answered, cached_known)),
        "prefix_hits": _sum(b.c.num_cached_prompt_tokens, answered),
        # Grounding (docs/grounding.md): per-answer shares averaged over the answers that have one.
        "grounded_n": _count(and_(answered, b.c.groundedness.is_not(None))),
        "groundedness_sum": _sum(b.c.groundedness, answered),
        "cited_n": _count(and_(answered, b.c.citation_precision.is_not(None))),
        "citation_precision_sum": _sum(b.c.citation_precision, answered),
    }
    key_cols = [b.c[k] for k in keys]
    stmt = select(*key_cols, *(c.label(n) for n, c in cols.items())).group_by(*key_cols)
    out = {}
    for row in session.execute(stmt).mappings():
        out[tuple(row[k] for k in keys)] = {n: row[n] for n in cols}
    return out


def latency_percentiles(
    session: Session, b: FromClause, keys: Sequence[str], metrics: Sequence[str] = LATENCY_METRICS
) -> dict[tuple[Any, ...], dict[str, dict[str, float | None]]]:
    """P50/P95/P99 of each latency of answered queries per key tuple (see ``sql.percentiles``)."""
    columns = {m: f"{m}_ms" for m in metrics}
    return percentiles(session, b, keys, columns, b.c.status == "succeeded")


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _ratio(num: Any, den: Any, scale: float = 1.0) -> float | None:
    if num is None or not den:
        return None
    return float(num) * scale / float(den)


def summarize(c: dict[str, Any], pct: dict[str, dict], curve: list[int]) -> dict[str, Any]:
    """The report's fields for one group (or the whole window) from its raw aggregates."""
    drafts = c["drafts"] or 0
    mal = _ratio(c["accepted_tokens"], drafts)
    samples = int(c["shadow_samples"])
    empty = {n: None for n in ("p50", "p95", "p99")}
    return {
        "requests": int(c["requests"]),
        "succeeded": int(c["succeeded"]),
        "failed": int(c["failed"]),
        "in_flight": int(c["in_flight"]),
        "latency_ms": {m: pct.get(m, dict(empty)) for m in LATENCY_METRICS},
        "output_tokens": int(c["output_tokens"] or 0),
        "output_tokens_per_s": _ratio(c["tokens_timed"], c["generation_ms_timed"], 1000.0),
        "acceptance_rate": _ratio(c["accepted_tokens"], c["draft_tokens"]),
        "mean_acceptance_length": None if mal is None else 1.0 + mal,
        "tokens_per_target_pass": _ratio(c["output_tokens"], c["target_forwards"]),
        # Load and the engine's choice of k, beside acceptance: a slow group with a large batch
        # is load; one alone with a small chosen k is draft quality.
        "mean_batch_size": _ratio(c["batch_size_sum"], c["batch_size_n"]),
        "mean_chosen_k": _ratio(c["chosen_k_sum"], c["chosen_k_n"]),
        "prefix_cache": {
            "queries": int(c["prefix_queries"] or 0),
            "hits": int(c["prefix_hits"] or 0),
            "hit_rate": _ratio(c["prefix_hits"], c["prefix_queries"]),
        },
        "groundedness": _ratio(c["groundedness_sum"], c["grounded_n"]),
        "citation_precision": _ratio(c["citation_precision_sum"], c["cited_n"]),
        "grounded_answers": int(c["grounded_n"] or 0),
        "acceptance_curve": [
            {"position": i, "accepted": n, "rate": _ratio(n, drafts)}
            for i, n in enumerate(curve, start=1)
        ],
        "speculative_requests": int(c["speculative_requests"]),
        "net_loss_share": _ratio(c["net_loss"], c["speculative_requests"]),
        "shadow": {
            "samples": samples,
            "pending": int(c["shadow_pending"]),
            "failed": int(c["shadow_failed"]),
            "speedup": _ratio(c["shadow_base_ms"], c["shadow_spec_ms"]),
            "exactness_violations": int(c["exactness_violations"]),
            "near_ties": int(c["near_ties"] or 0),
            "near_tie_gap_min": _float(c["near_tie_gap_min"]),
            "near_tie_gap_max": _float(c["near_tie_gap_max"]),
            "unjudged_mismatches": int(c["unjudged_mismatches"] or 0),
            "mismatched_tokens": int(c["mismatched_tokens"] or 0),
            "measured_net_loss_share": _ratio(c["measured_loss"], samples),
        },
    }


def aggregate(
    session: Session, b: FromClause, keys: Sequence[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole of ``b``'s rows summarized, and one summarized dict per key tuple of ``keys``.

    ``b`` is ``base(window)`` or its ``materialized`` copy. Each group dict carries its key
    columns by name, then the fields of ``summarize``; busiest first. Counts, sums and
    per-position sums add up across groups, so the totals are the groups' sums (no second scan;
    the near-tie gap extremes take the groups' min and max);
    percentiles do not, so they get their own query.
    """
    counts = counters(session, b, keys)
    pcts = latency_percentiles(session, b, keys)
    curves = position_sums(session, b, keys)
    if keys and counts:
        names = list(next(iter(counts.values())))
        total = {n: sum(c[n] or 0 for c in counts.values()) for n in names}
        for n, pick in EXTREMES.items():  # a min or max of the groups', not a sum
            found = [c[n] for c in counts.values() if c[n] is not None]
            total[n] = pick(found) if found else None
        curve = [sum(x) for x in zip_longest(*curves.values(), fillvalue=0)]
        overall = summarize(total, latency_percentiles(session, b, []).get((), {}), curve)
    elif keys:  # no rows at all: the totals of nothing
        overall = summarize(counters(session, b, [])[()], {}, [])
    else:
        overall = summarize(counts[()], pcts.get((), {}), curves.get((), []))
    rows = []
    for key, c in counts.items() if keys else ():
        row = dict(zip(keys, key, strict=True))
        row.update(summarize(c, pcts.get(key, {}), curves.get(key, [])))
        rows.append(row)
    rows.sort(key=lambda r: (-r["requests"], [str(r[k]) for k in keys]))
    return overall, rows
