"""The report's alerts: what an admin must look at first, found in the finished report.

Kinds: ``exactness_violation`` (critical: a shadow baseline differs from its speculative answer at a
clear margin, or at all in float32; near-ties within bfloat16 rounding are counted, not alerted),
``exactness_unjudged`` (warning: a non-float32 mismatch no logits could judge, per dtype),
``speculation_slower`` (the measured speedup is below 1: the whole window with a 95 % interval
entirely below 1, or a group's shadow samples), ``acceptance_falling`` (a model pair's acceptance
in the window's second half fell by more than ``acceptance_drop`` from its first half),
``acceptance_collapse`` (below a floor, or far below the trailing week) and
``latency_regression`` (P95 above the previous window's) and ``groundedness_falling``
(app/audit/grounding_alerts.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

import app.audit.units as units
from app.audit.aggregate import base, counters, latency_percentiles
from app.audit.grounding_alerts import groundedness_alerts
from app.audit.trends import halves
from app.audit.window import Window
from app.settings import Settings

log = logging.getLogger(__name__)
TRAILING = timedelta(days=7)


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
    acceptance_drop: float = 0.2
    """A pair's acceptance falling by more than this fraction within the window is an alert."""

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


def _alert(kind: str, severity: str, group: dict[str, Any], message: str) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "group": group, "message": message}


def speed_alerts(report: dict[str, Any], th: Thresholds) -> list[dict[str, Any]]:
    """Speculation slower than its baseline (window and groups), acceptance falling per pair."""
    found = []
    sp = report["headline"]["speedup"]
    hi = sp["ci"][1]
    if sp["value"] is not None and sp["n"] >= th.min_samples and hi is not None and hi < 1.0:
        found.append(
            _alert(
                "speculation_slower",
                "warning",
                {},
                f"speculation is slower than the baseline: speedup {sp['value']:.2f}x "
                f"(95 % CI {sp['ci'][0]:.2f}-{hi:.2f}) over {sp['n']:,} answers ({sp['method']})",
            )
        )
    keys = report["group_by"]
    for g in report["groups"]:
        shadow = g["shadow"]
        if shadow["speedup"] is not None and shadow["samples"] >= th.min_samples:
            if shadow["speedup"] < 1.0:
                where = ", ".join(f"{k}={g[k]}" for k in keys)
                found.append(
                    _alert(
                        "speculation_slower",
                        "warning",
                        {k: g[k] for k in keys},
                        f"{where}: speculation slower than the baseline "
                        f"({shadow['speedup']:.2f}x over {shadow['samples']:,} shadow samples)",
                    )
                )
    window = Window.from_report(report)
    for series in report["timeline"]["acceptance_by_pair"]:
        first, second = halves(series["points"], window)
        if min(first["speculative_requests"], second["speculative_requests"]) < th.min_samples:
            continue
        before = first["accepted_tokens"] / max(first["draft_tokens"], 1)
        after = second["accepted_tokens"] / max(second["draft_tokens"], 1)
        if before > 0 and after < (1.0 - th.acceptance_drop) * before:
            found.append(
                _alert(
                    "acceptance_falling",
                    "warning",
                    {"model_pair": series["model_pair"]},
                    f"model_pair={series['model_pair']}: acceptance fell from {before:.1%} in "
                    f"the window's first half to {after:.1%} in its second",
                )
            )
    return found


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
        shadow = row["shadow"]
        bad = shadow["exactness_violations"]
        if bad:
            ties = f"; {shadow['near_ties']} near-tie(s) excused" if shadow["near_ties"] else ""
            found.append(
                {
                    "kind": "exactness_violation",
                    "severity": "critical",
                    "group": key,
                    "message": f"{where}: {bad} shadow-sampled answer(s) differ from greedy "
                    "decoding without speculation at a clear margin (or at all in float32)"
                    f"{ties}",
                }
            )
    if report["shadow"]["unjudged_mismatches"]:
        found += _unjudged(session, window)
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
                        f"below {th.collapse_ratio:.0%} of the trailing week's {units.share(before)}",
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
                        "message": f"{where}: P95 total latency {units.ms(now)} vs "
                        f"{units.ms(p95_prev)} "
                        f"in the previous window (+{now / p95_prev - 1:.0%})",
                    }
                )
    found += speed_alerts(report, th)
    found += groundedness_alerts(session, window, report, th.min_samples)
    order = {"critical": 0, "warning": 1}
    found.sort(key=lambda a: order.get(a["severity"], 2))
    for a in found:
        level = logging.ERROR if a["severity"] == "critical" else logging.WARNING
        log.log(level, "audit alert %s: %s", a["kind"], a["message"])
    return found


def _unjudged(session: Session, window: Window) -> list[dict[str, Any]]:
    """One warning per dtype whose shadow mismatches no logits could judge (vLLM, bf16)."""
    b = base(window)
    unjudged = and_(b.c.shadow_status == "done", b.c.judgment == "unjudged")
    stmt = select(b.c.shadow_dtype, func.count()).where(unjudged).group_by(b.c.shadow_dtype)
    found = []
    for dtype, n in session.execute(stmt).all():
        named = dtype or "an unrecorded dtype"
        found.append(
            {
                "kind": "exactness_unjudged",
                "severity": "warning",
                "group": {},
                "message": f"{n} shadow-sampled answer(s) in {named} differ from greedy decoding "
                "without speculation, and the engine exposes no logits to tell a near-tie from a "
                "violation: re-check them on the torch engine, or run that worker in float32",
            }
        )
    return found


def _collapse(key: dict[str, Any], where: str, rate: float, why: str) -> dict[str, Any]:
    return {
        "kind": "acceptance_collapse",
        "severity": "warning",
        "group": key,
        "message": f"{where}: acceptance rate {units.share(rate)} is {why}",
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
