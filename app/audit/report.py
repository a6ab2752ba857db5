"""The audit report as data: the window's totals, groups, timeline and alerts (JSON-ready dict).

Schema (stable; documented field by field in docs/audit.md): the contract's ``since, until,
requests, succeeded, failed, latency_ms, acceptance_rate, mean_acceptance_length, groups`` plus
``schema_version, empty, note, group_by, in_flight, output_tokens, output_tokens_per_s,
tokens_per_target_pass, mean_batch_size, mean_chosen_k, prefix_cache, acceptance_curve,
speculative_requests, net_loss_share, shadow, timeline, alerts, thresholds``. Golden-evaluation queries are not traffic and are left out.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import FromClause, select
from sqlalchemy.orm import Session

from app.audit.aggregate import (
    aggregate,
    base,
    counters,
    latency_percentiles,
    materialized,
    summarize,
)
from app.audit.sql import bucket_index
from app.audit.window import DEFAULT_GROUP_BY, Window
from app.settings import Settings

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
TRAILING = timedelta(days=7)
# Timeline bucket widths (seconds): the smallest that keeps a window to at most 48 points.
BUCKETS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)


@dataclass(frozen=True)
class Thresholds:
    """When the report raises an alert (defaults from Settings' ``audit_*`` fields)."""

    min_acceptance_rate: float = 0.2
    """Acceptance below this is a collapse."""
    collapse_ratio: float = 0.5
    """Acceptance below this fraction of the trailing week's is a collapse too."""
    latency_regression: float = 0.25
    """P95 total latency more than this fraction above the previous window's is a regression."""
    min_samples: int = 20
    """Fewest requests (in each compared window) a group needs before it is alerted on."""

    @classmethod
    def from_settings(cls, settings: Settings | None) -> Thresholds:
        """The thresholds configured in ``settings`` (the defaults when None)."""
        if settings is None:
            return cls()
        return cls(
            settings.audit_min_acceptance_rate,
            settings.audit_collapse_ratio,
            settings.audit_latency_regression,
            settings.audit_min_samples,
        )


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
        points = timeline(session, window, rows) if busy else _no_timeline(window)
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
    if report["empty"]:
        report["note"] = f"no requests were queued between {report['since']} and {report['until']}"
        return report
    report["alerts"] = alerts(session, window, report, th)
    return report


def _bucket_seconds(window: Window) -> int:
    span = window.span.total_seconds()
    return next((b for b in BUCKETS if span / b <= 48), BUCKETS[-1])


def _no_timeline(window: Window) -> dict[str, Any]:
    return {"bucket_seconds": _bucket_seconds(window), "points": []}


def timeline(session: Session, window: Window, b: FromClause) -> dict[str, Any]:
    """Requests and latency percentiles per time bucket of the window (empty buckets left out).

    ``b`` holds the window's rows (``base`` or its ``materialized`` copy).
    """
    width = _bucket_seconds(window)
    idx = bucket_index(session, b.c.queued_at, window.since, width).label("bucket")
    bb = select(*b.c, idx).subquery("bucketed")
    counts = counters(session, bb, ["bucket"])
    pcts = latency_percentiles(session, bb, ["bucket"], ("total", "ttft"))
    points = []
    for (bucket,), c in sorted(counts.items(), key=lambda kv: int(kv[0][0])):
        s = summarize(c, pcts.get((bucket,), {}), [])
        start = window.since + timedelta(seconds=int(bucket) * width)
        points.append(
            {
                "start": start.isoformat(),
                "requests": s["requests"],
                "failed": s["failed"],
                "latency_ms": {m: s["latency_ms"][m] for m in ("total", "ttft")},
                "acceptance_rate": s["acceptance_rate"],
            }
        )
    return {"bucket_seconds": width, "points": points}


def _label(group: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={group[k]}" for k in keys) or "all requests"


def alerts(
    session: Session, window: Window, report: dict[str, Any], th: Thresholds
) -> list[dict[str, Any]]:
    """Exactness violations, acceptance collapses and latency regressions found in the report."""
    keys = report["group_by"]
    found: list[dict[str, Any]] = []
    rows = [({}, report)] + [({k: g[k] for k in keys}, g) for g in report["groups"]]
    for key, row in rows:
        where = _label(row, list(key))
        bad = row["shadow"]["exactness_violations"]
        if bad:
            found.append(
                {
                    "kind": "exactness_violation",
                    "severity": "critical",
                    "group": key,
                    "message": f"{where}: {bad} shadow-sampled answer(s) differ from greedy "
                    f"decoding without speculation ({row['shadow']['mismatched_tokens']} tokens)",
                }
            )
    prev_keys = list(keys)
    trailing = _acceptance(session, window.trailing(TRAILING), prev_keys)
    previous = _p95_total(session, window.previous(), prev_keys)
    for key, row in rows:
        where = _label(row, list(key))
        kt = tuple(key.get(k) for k in prev_keys) if key else None
        rate = row["acceptance_rate"]
        if rate is not None and row["speculative_requests"] >= th.min_samples:
            before = trailing.get(kt) if kt is not None else trailing.get(None)
            if rate < th.min_acceptance_rate:
                found.append(_collapse(key, where, rate, f"below {th.min_acceptance_rate:.2f}"))
            elif before is not None and rate < th.collapse_ratio * before:
                found.append(
                    _collapse(
                        key,
                        where,
                        rate,
                        f"below {th.collapse_ratio:.0%} of the trailing week's {before:.3f}",
                    )  # fmt: skip
                )
        now = row["latency_ms"]["total"]["p95"]
        was = previous.get(kt) if kt is not None else previous.get(None)
        if now is not None and was and row["succeeded"] >= th.min_samples:
            p95_prev, n_prev = was
            if n_prev >= th.min_samples and now > (1 + th.latency_regression) * p95_prev:
                found.append(
                    {
                        "kind": "latency_regression",
                        "severity": "warning",
                        "group": key,
                        "message": f"{where}: P95 total latency {now:.0f} ms vs {p95_prev:.0f} ms "
                        f"in the previous window (+{now / p95_prev - 1:.0%})",
                    }
                )
    for a in found:
        level = logging.ERROR if a["severity"] == "critical" else logging.WARNING
        log.log(level, "audit alert %s: %s", a["kind"], a["message"])
    return found


def _collapse(key: dict[str, Any], where: str, rate: float, why: str) -> dict[str, Any]:
    return {
        "kind": "acceptance_collapse",
        "severity": "warning",
        "group": key,
        "message": f"{where}: acceptance rate {rate:.3f} is {why}",
    }


def _acceptance(session: Session, window: Window, keys: list[str]) -> dict[Any, float]:
    """Acceptance rate per key tuple (and None for the whole window) over ``window``."""
    out: dict[Any, float] = {}
    accepted = drafted = 0
    for key, c in counters(session, base(window), keys).items():
        # Token counts add up across groups, so the whole window's rate needs no second scan.
        accepted += c["accepted_tokens"] or 0
        drafted += c["draft_tokens"] or 0
        if c["draft_tokens"]:
            out[key] = float(c["accepted_tokens"]) / c["draft_tokens"]
    if drafted:
        out[None] = accepted / drafted
    return out


def _p95_total(session: Session, window: Window, keys: list[str]) -> dict[Any, tuple[float, int]]:
    """P95 total latency and sample count per key tuple (None: whole window) over ``window``."""
    b = base(window)
    counts = counters(session, b, keys)
    out: dict[Any, tuple[float, int]] = {}
    for ks, label in ((keys, True), ([], False)):
        for key, by_metric in latency_percentiles(session, b, ks, ("total",)).items():
            p95 = by_metric.get("total", {}).get("p95")
            n = sum(int(c["succeeded"]) for k, c in counts.items() if not label or k == key)
            if p95 is not None:
                out[key if label else None] = (p95, n)
    return out
