"""The audit report's charts as matplotlib Figures (object API: no pyplot, no global state).

matplotlib is imported when a chart is drawn, not with this module: ``app.db`` imports the audit
tables, and every process that touches the database should not pay for a plotting library.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(size: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure  # heavy: matplotlib

    return Figure(figsize=size)


SIZE = (8.0, 3.4)


def _empty(fig: Figure, message: str) -> Figure:
    ax = fig.subplots()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def latency_over_time(timeline: dict[str, Any], metric: str = "total") -> Figure:
    """P50/P95/P99 of ``metric`` latency per timeline bucket."""
    fig = _figure(SIZE)
    points = [p for p in timeline["points"] if p["latency_ms"][metric]["p50"] is not None]
    if not points:
        return _empty(fig, "no answered requests in this window")
    ax = fig.subplots()
    xs: list[Any] = [datetime.fromisoformat(p["start"]) for p in points]
    for name, style in (("p50", "-o"), ("p95", "-s"), ("p99", "-^")):
        ax.plot(xs, [p["latency_ms"][metric][name] for p in points], style, ms=3, label=name)
    ax.set_ylabel(f"{metric} latency (ms)")
    ax.set_title(f"{metric} latency per {timeline['bucket_seconds'] // 60:,} min bucket")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    _time_axis(fig, ax, timeline)
    return fig


def _time_axis(fig: Figure, ax: Any, timeline: dict[str, Any]) -> None:
    """The x axis spans exactly the window (one point no longer stretches it over years)."""
    from matplotlib.dates import DateFormatter  # heavy: matplotlib
    from matplotlib.ticker import FuncFormatter

    if "since" in timeline:
        since = datetime.fromisoformat(timeline["since"])
        until = datetime.fromisoformat(timeline["until"])
        ax.set_xlim(since, until)
        days = (until - since).total_seconds() / 86400
        ax.xaxis.set_major_formatter(DateFormatter("%H:%M" if days <= 1 else "%m-%d %H:%M"))
    ax.yaxis.set_major_formatter(
        FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 10 else f"{v:g}")
    )
    fig.autofmt_xdate()


def acceptance_over_time(timeline: dict[str, Any]) -> Figure:
    """Acceptance rate per bucket, one step line per model pair (a draft swap shows as a step)."""
    fig = _figure(SIZE)
    series = [s for s in timeline.get("acceptance_by_pair", []) if s["points"]][:8]
    if not series:
        return _empty(fig, "no speculative drafts in this window")
    ax = fig.subplots()
    for s in series:
        xs: list[Any] = [datetime.fromisoformat(p["start"]) for p in s["points"]]
        ys = [p["acceptance_rate"] for p in s["points"]]
        ax.step(xs, ys, where="post", marker="o", ms=3, label=s["model_pair"])
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    _time_axis(fig, ax, timeline)
    return fig


def acceptance_by_position(series: list[tuple[str, list[dict[str, Any]]]]) -> Figure:
    """Acceptance rate at each draft position, one line per (label, curve)."""
    fig = _figure(SIZE)
    series = [(label, curve) for label, curve in series if curve]
    if not series:
        return _empty(fig, "no speculative drafts in this window")
    ax = fig.subplots()
    for label, curve in series[:8]:
        ax.plot(
            [c["position"] for c in curve],
            [c["rate"] or 0.0 for c in curve],
            "-o",
            ms=3,
            label=label,
        )
    ax.set_xlabel("draft position")
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of drafts accepted")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return fig


def speedup_by_segment(groups: list[dict[str, Any]], keys: list[str]) -> Figure:
    """Per group: measured speedup (shadow baselines) beside tokens per target pass."""
    fig = _figure((SIZE[0], max(SIZE[1], 0.35 * len(groups) + 1)))
    rows = [g for g in groups if g.get("method") != "none"][:20]
    if not rows:
        return _empty(fig, "no speculative requests in this window")
    ax = fig.subplots()
    labels = [" / ".join(str(g[k]) for k in keys) or "all" for g in rows]
    ys = list(range(len(rows)))
    measured = [g["shadow"]["speedup"] or 0.0 for g in rows]
    per_pass = [g["tokens_per_target_pass"] or 0.0 for g in rows]
    ax.barh([y - 0.2 for y in ys], measured, height=0.4, label="measured speedup (shadow)")
    ax.barh([y + 0.2 for y in ys], per_pass, height=0.4, label="tokens per target pass")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("x baseline (1 = no gain)")
    ax.legend(fontsize=7, loc="lower right")
    return fig
