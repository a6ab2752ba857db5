"""The audit report in its three formats: JSON (stable schema), CSV (one row per group), HTML."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.audit.aggregate import LATENCY_METRICS
from app.audit.page import html_sections
from app.audit.render import html_report, to_csv
from app.audit.report import Thresholds, build_report
from app.audit.window import check_format, parse_group_by, parse_window
from app.settings import Settings

MEDIA_TYPES = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "html": "text/html; charset=utf-8",
}
CURVE_POSITIONS = 8


def flat_row(row: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """One group (or the totals) as a flat CSV/table row."""
    out: dict[str, Any] = {k: row.get(k, "(all)") for k in keys}
    for name in ("requests", "succeeded", "failed", "in_flight", "output_tokens"):
        out[name] = row[name]
    for metric in LATENCY_METRICS:
        for p, value in row["latency_ms"][metric].items():
            out[f"{metric}_ms_{p}"] = value
    for name in (
        "output_tokens_per_s",
        "acceptance_rate",
        "mean_acceptance_length",
        "tokens_per_target_pass",
        "mean_batch_size",
        "mean_chosen_k",
        "speculative_requests",
        "net_loss_share",
    ):
        out[name] = row[name]
    for name, value in row["prefix_cache"].items():
        out[f"prefix_cache_{name}"] = value
    curve = {c["position"]: c["rate"] for c in row["acceptance_curve"]}
    for pos in range(1, CURVE_POSITIONS + 1):
        out[f"acceptance_pos_{pos}"] = curve.get(pos)
    for name, value in row["shadow"].items():
        out[f"shadow_{name}"] = value
    return out


def csv_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The totals row (group columns "(all)") followed by one row per group."""
    keys = report["group_by"]
    return [flat_row(report, keys)] + [flat_row(g, keys) for g in report["groups"]]


def render(report: dict[str, Any], fmt: str) -> tuple[str, str]:
    """``(media_type, body)`` of ``report`` in ``fmt`` (json, csv or html)."""
    check_format(fmt)
    if fmt == "json":
        return MEDIA_TYPES[fmt], json.dumps(report, indent=2, default=str)
    if fmt == "csv":
        return MEDIA_TYPES[fmt], to_csv(csv_rows(report))
    title = f"specrag audit {report['since'][:16]} to {report['until'][:16]}"
    return MEDIA_TYPES[fmt], html_report(title, html_sections(report))


def render_report(
    session: Session,
    *,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    fmt: str = "json",
    group_by: str | list[str] | None = None,
    settings: Settings | None = None,
) -> tuple[str, str]:
    """The audit report over ``[since, until)`` as ``(media_type, body)``.

    Raises ValueError naming the field (``since``, ``until``, ``format``, ``group_by``) for bad
    input; an empty window gives an empty report that says so, not an error.
    """
    check_format(fmt)
    window = parse_window(since, until)
    keys = parse_group_by(group_by)
    report = build_report(session, window, keys, Thresholds.from_settings(settings))
    return render(report, fmt)
