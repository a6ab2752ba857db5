"""The audit report as data: the headline, the window's totals, groups, trends and alerts.

Schema (stable; documented field by field in docs/audit.md): the contract's ``since, until,
requests, succeeded, failed, latency_ms, acceptance_rate, mean_acceptance_length, groups`` plus
``schema_version, empty, note, group_by, headline, in_flight, output_tokens, output_tokens_per_s,
tokens_per_target_pass, mean_batch_size, mean_chosen_k, prefix_cache, acceptance_curve,
speculative_requests, net_loss_share, shadow, timeline, non_traffic, alerts, thresholds,
slowest``; ``slowest``: the window's slowest answers with their trace ids (docs/operations.md,
"Tracing"), so that a slow row leads to where its time went.
Only traffic counts (``queries.source`` api, cli, batch); one-shot local answers, golden
evaluations and benchmark runs are summarized apart under ``non_traffic``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from app.audit.aggregate import aggregate, base, materialized
from app.audit.alerts import TRAILING, Thresholds, alerts
from app.audit.headline import build_headline
from app.audit.trends import empty_timeline, timeline
from app.audit.window import DEFAULT_GROUP_BY, Window
from app.db.models import QUERY_SOURCES, TRAFFIC_SOURCES, Query

SCHEMA_VERSION = 1
SLOWEST = 10
"""Answers listed in the report's ``slowest``."""
NON_TRAFFIC = tuple(s for s in QUERY_SOURCES if s not in TRAFFIC_SOURCES)

__all__ = ["TRAILING", "Thresholds", "build_report", "non_traffic"]


def build_report(
    session: Session,
    window: Window,
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY,
    thresholds: Thresholds | None = None,
) -> dict[str, Any]:
    """The report over ``window`` grouped by ``group_by``; an empty window gives an empty report."""
    th = thresholds or Thresholds()
    with materialized(session, window) as rows:
        overall, groups = aggregate(session, rows, list(group_by))
        busy = overall["requests"] > 0
        points = timeline(session, window, rows) if busy else empty_timeline(window)
        report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "since": window.since.isoformat(),
            "until": window.until.isoformat(),
            "empty": overall["requests"] == 0,
            "note": None,
            "group_by": list(group_by),
            **overall,
            "groups": groups,
            "timeline": points,
            "alerts": [],
            "thresholds": asdict(th),
        }
        report["headline"] = build_headline(session, rows, window, report)
        report["slowest"] = slowest(session, rows)
    report["non_traffic"] = non_traffic(session, window)
    if report["empty"]:
        report["note"] = f"no requests were queued between {report['since']} and {report['until']}"
        return report
    report["alerts"] = alerts(session, window, report, th)
    return report


def slowest(session: Session, rows: Table, limit: int = SLOWEST) -> list[dict[str, Any]]:
    """The ``limit`` answered queries of the window with the longest total latency, slowest
    first: id, tenant, collection, method, total and stage milliseconds, and the trace id (null
    when the query was not traced)."""
    c = rows.c
    found = session.execute(
        select(c.query_id, c.tenant, c.collection, c.method, c.total_ms, c.queue_ms,
               c.retrieval_ms, c.generation_ms, c.trace_id)
        .where(c.total_ms.is_not(None))
        .order_by(c.total_ms.desc(), c.query_id)
        .limit(limit)
    ).all()  # fmt: skip
    return [{**row._asdict(), "query_id": str(row.query_id)} for row in found]


def non_traffic(session: Session, window: Window) -> list[dict[str, Any]]:
    """Per non-traffic source with queries in the window: counts and latency percentiles."""
    q = Query.__table__
    # Usually none: one cheap count decides before the five-table aggregates run.
    found = session.scalar(
        select(func.count()).where(
            q.c.queued_at >= window.since, q.c.queued_at < window.until,
            q.c.source.in_(NON_TRAFFIC),
        )
    )  # fmt: skip
    if not found:
        return []
    _, groups = aggregate(session, base(window, NON_TRAFFIC), ["source"])
    keep = ("requests", "succeeded", "failed", "latency_ms", "acceptance_rate")
    return [{"source": g["source"], **{k: g[k] for k in keep}} for g in groups]
