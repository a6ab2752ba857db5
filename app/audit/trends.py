"""The report's trends: latency and acceptance per time bucket, acceptance per model pair.

Buckets follow the window's length: the smallest of 1 min ... 30 days that keeps the window to at
most 48 buckets (an hour's window gets 1- or 5-minute points, a week's 3- or 6-hour ones).
Acceptance is drawn per model pair, so a draft swap shows as a step where the pair changes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import FromClause, select
from sqlalchemy.orm import Session

from app.audit.aggregate import counters, latency_percentiles, summarize
from app.audit.sql import bucket_index
from app.audit.window import Window

# Timeline bucket widths (seconds): the smallest that keeps a window to at most 48 points.
BUCKETS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
MAX_POINTS = 48


def bucket_seconds(window: Window) -> int:
    """The bucket width for ``window`` (seconds)."""
    span = window.span.total_seconds()
    return next((b for b in BUCKETS if span / b <= MAX_POINTS), BUCKETS[-1])


def empty_timeline(window: Window) -> dict[str, Any]:
    """A timeline with no points (an empty window)."""
    return {
        "bucket_seconds": bucket_seconds(window),
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "points": [],
        "acceptance_by_pair": [],
    }


def _bucketed(session: Session, window: Window, b: FromClause) -> FromClause:
    idx = bucket_index(session, b.c.queued_at, window.since, bucket_seconds(window))
    return select(*b.c, idx.label("bucket")).subquery("bucketed")


def _start(window: Window, bucket: Any) -> str:
    return (window.since + timedelta(seconds=int(bucket) * bucket_seconds(window))).isoformat()


def timeline(session: Session, window: Window, b: FromClause) -> dict[str, Any]:
    """Requests and latency percentiles per time bucket of the window (empty buckets left out),
    and acceptance per bucket and model pair. ``b`` holds the window's rows."""
    bb = _bucketed(session, window, b)
    counts = counters(session, bb, ["bucket"])
    pcts = latency_percentiles(session, bb, ["bucket"], ("total", "ttft"))
    points = []
    for (bucket,), c in sorted(counts.items(), key=lambda kv: int(kv[0][0])):
        s = summarize(c, pcts.get((bucket,), {}), [])
        points.append(
            {
                "start": _start(window, bucket),
                "requests": s["requests"],
                "failed": s["failed"],
                "latency_ms": {m: s["latency_ms"][m] for m in ("total", "ttft")},
                "acceptance_rate": s["acceptance_rate"],
            }
        )
    out = empty_timeline(window)
    out["points"] = points
    out["acceptance_by_pair"] = _acceptance_by_pair(session, window, bb)
    return out


def _acceptance_by_pair(session: Session, window: Window, bb: FromClause) -> list[dict[str, Any]]:
    """Per model pair: acceptance rate, drafted tokens and speculative requests per bucket."""
    series: dict[str, list[dict[str, Any]]] = {}
    rows = counters(session, bb, ["model_pair", "bucket"])
    for (pair, bucket), c in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), int(kv[0][1]))):
        if pair is None or not c["draft_tokens"]:
            continue
        series.setdefault(str(pair), []).append(
            {
                "start": _start(window, bucket),
                "bucket": int(bucket),
                "acceptance_rate": float(c["accepted_tokens"]) / float(c["draft_tokens"]),
                "accepted_tokens": int(c["accepted_tokens"]),
                "draft_tokens": int(c["draft_tokens"]),
                "speculative_requests": int(c["speculative_requests"]),
            }
        )
    return [{"model_pair": pair, "points": pts} for pair, pts in series.items()]


def halves(points: list[dict[str, Any]], window: Window) -> tuple[dict[str, int], dict[str, int]]:
    """Accepted and drafted tokens and speculative requests in the window's first and second
    half (a bucket counts where it starts)."""
    mid = window.span.total_seconds() / 2 / bucket_seconds(window)
    first = {"accepted_tokens": 0, "draft_tokens": 0, "speculative_requests": 0}
    second = dict(first)
    for p in points:
        side = first if p["bucket"] < mid else second
        for k in side:
            side[k] += p[k]
    return first, second
