"""The audit report's HTML page: headline cards first, alerts, the groups that matter, trends.

Every figure is in plain units (``app.audit.units``). Each headline figure sits in an element
with ``data-figure`` (``p95_spec``, ``p95_baseline``, ``speedup``, ``acceptance``, ``quality``)
so a browser test can read it back and check where it landed on the screen.
"""

from __future__ import annotations

import html
from typing import Any

import app.audit.charts as charts
import app.audit.units as units
from app.audit.render import Section

TABLE_ROWS = 25


def _fig(name: str, text: str) -> str:
    return f'<span data-figure="{name}">{html.escape(text)}</span>'


def _latency_card(title: str, h: dict[str, Any], metric: str, p: str) -> str:
    spec = h["speculative"][metric]
    base = h["baseline"][metric]
    name = f"{p}_{'total' if metric == 'total_ms' else 'ttft'}"
    spec_text = units.ms(spec[p])
    if base is None:
        base_html = f'<span class="vs">vs {_fig(name + "_baseline", h["baseline"]["note"])}</span>'
        base_ci = ""
    else:
        base_html = (
            f'<span class="vs">vs baseline {_fig(name + "_baseline", units.ms(base[p]))}</span>'
        )
        base_ci = f"baseline {units.interval(*base['ci'][p])}, n = {units.count(base['n'])}"
    spec_ci = f"speculative {units.interval(*spec['ci'][p])}, n = {units.count(spec['n'])}"
    return (
        f'<div class="card"><h3>{html.escape(title)}</h3>'
        f'<div class="big">{_fig(name + "_spec", spec_text)} {base_html}</div>'
        f'<div class="sub">{html.escape(spec_ci)}<br>{html.escape(base_ci)}</div></div>'
    )


def headline_html(report: dict[str, Any]) -> str:
    """The headline block: five figures and their evidence, as a grid of cards."""
    h = report["headline"]
    src = h["baseline"]["sources"]
    which = (
        f"baseline: {units.count(src['shadow'])} shadow re-decodes + "
        f"{units.count(src['none_traffic'])} method-none answers"
        if h["baseline"]["available"]
        else h["baseline"]["note"]
    )
    sp = h["speedup"]
    speed = units.times(sp["value"]) if sp["value"] is not None else sp["note"]
    speed_sub = (
        f"{units.interval(sp['ci'][0], sp['ci'][1], fmt='times')}; {sp['note']}, n = {units.count(sp['n'])}"
        if sp["value"] is not None
        else "needs shadow samples or method-none traffic"
    )
    q = h["quality"]
    q_sub = "; ".join(
        f"{name} {units.number(m['speculative'], 3)} vs {units.number(m['baseline'], 3)} "
        f"(p = {units.number(m['p_value'], 3)}, {m['test']})"
        for name, m in q["metrics"].items()
        if m["n"]
    )
    run = f"golden run {q['run_id'][:8]}, {q.get('items', 0)} items: " if q["run_id"] else ""
    slow = sp["value"] is not None and sp["value"] < 1.0
    cards = [
        _latency_card("Total latency P95", h, "total_ms", "p95"),
        _latency_card("Total latency P50", h, "total_ms", "p50"),
        _latency_card("Time to first token P95", h, "ttft_ms", "p95"),
        f'<div class="card{" bad" if slow else ""}"><h3>Measured speedup</h3>'
        f'<div class="big">{_fig("speedup", speed)}</div>'
        f'<div class="sub">{html.escape(speed_sub)}</div></div>',
        '<div class="card"><h3>Acceptance</h3>'
        f'<div class="big">{_fig("acceptance", units.share(h["acceptance_rate"]))}</div>'
        f'<div class="sub">mean acceptance length '
        f"{html.escape(units.number(h['mean_acceptance_length']))} tokens per target pass; "
        f"{html.escape(units.count(h['speculative_requests']))} speculative answers</div></div>",
        '<div class="card"><h3>Answer quality (speculative vs greedy)</h3>'
        f'<div class="big" style="font-size:1.05em">{_fig("quality", q["verdict"])}</div>'
        f'<div class="sub">{html.escape(run + q_sub)}</div></div>',
    ]
    return (
        f'<p class="note">{html.escape(which)}. Percentile intervals: order statistics (95 %); '
        f"speedup interval: delta method.</p>"
        f'<div class="cards">{"".join(cards)}</div>'
    )


def group_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The groups as compact rows, slowest P95 first (then the larger net-loss share)."""
    keys = report["group_by"]
    rows: list[tuple[float, float, dict[str, str]]] = []
    for g in report["groups"]:
        lat = g["latency_ms"]
        row = {
            "group": " / ".join(str(g[k]) for k in keys),
            "requests": units.count(g["requests"]),
            "P50 total": units.ms(lat["total"]["p50"]),
            "P95 total": units.ms(lat["total"]["p95"]),
            "P95 TTFT": units.ms(lat["ttft"]["p95"]),
            "acceptance": units.share(g["acceptance_rate"]),
            "net loss": units.share(g["net_loss_share"]),
            "speedup": units.times(g["shadow"]["speedup"]),
            "violations": units.count(g["shadow"]["exactness_violations"]),
            "near-ties (gap)": _near_ties(g["shadow"]),
        }
        rows.append((-(lat["total"]["p95"] or -1.0), -(g["net_loss_share"] or 0.0), row))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows]


def _near_ties(shadow: dict[str, Any]) -> str:
    """Excused near-ties: their count, and the smallest and largest top-2 gap among them."""
    n = shadow["near_ties"]
    if not n:
        return "0"
    lo, hi = shadow["near_tie_gap_min"], shadow["near_tie_gap_max"]
    return f"{n} (gap {lo:.3g}-{hi:.3g})" if lo is not None and hi is not None else str(n)


MAX_ALERTS = 6


def _alerts(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The most severe alerts first, the rest counted (the JSON lists them all)."""
    if not found:
        return [{"severity": "ok", "message": "no alerts"}]
    rest = len(found) - MAX_ALERTS
    more = [{"severity": "note", "message": f"and {rest} more (see the JSON report)"}]
    return found[:MAX_ALERTS] + (more if rest > 0 else [])


def html_sections(report: dict[str, Any]) -> list[Section]:
    """The report as HTML sections: headline, alerts, groups, trends, then what is not traffic."""
    keys = report["group_by"]
    window = f"{report['since'][:16]} to {report['until'][:16]} UTC"
    if report["empty"]:
        return [Section("Summary", text=f"Empty report: {report['note']}.")]
    summary = (
        f"Window {window}: {units.count(report['requests'])} requests, "
        f"{units.count(report['succeeded'])} succeeded, {units.count(report['failed'])} failed; "
        f"exactness violations in shadow samples: {report['shadow']['exactness_violations']}"
        f"; near-ties excused: {_near_ties(report['shadow'])}"
        + (
            f"; mismatches left unjudged (no logits): {report['shadow']['unjudged_mismatches']}."
            if report["shadow"]["unjudged_mismatches"]
            else "."
        )
    )
    rows = group_rows(report)
    shown = rows[:TABLE_ROWS]
    more = (
        f" Showing {len(shown)} of {len(rows)}; the CSV has every group and column."
        if len(rows) > len(shown)
        else " The CSV has every column."
    )
    curves = [("all requests", report["acceptance_curve"])] + [
        (" / ".join(str(g[k]) for k in keys), g["acceptance_curve"]) for g in report["groups"]
    ]
    no_shadow = report["shadow"]["samples"] == 0
    tl = report["timeline"]
    non = [
        {"source": n["source"], "requests": units.count(n["requests"]),
         "P50 total": units.ms(n["latency_ms"]["total"]["p50"]),
         "P95 total": units.ms(n["latency_ms"]["total"]["p95"])}
        for n in report["non_traffic"]
    ]  # fmt: skip
    return [
        Section("Headline", text=summary, raw_html=headline_html(report)),
        Section("Alerts", alerts=_alerts(report["alerts"])),
        Section(
            f"Groups by {' / '.join(keys)}, slowest first",
            text="Sorted by P95 total latency, then by net-loss share (speculative answers that "
            "accepted fewer draft tokens than they ran verification rounds)." + more,
            columns=list(shown[0]) if shown else [],
            rows=shown,
        ),
        Section(
            "Trends",
            text=f"One point per {units.count(tl['bucket_seconds'] // 60)} min bucket.",
            figures=[
                (charts.latency_over_time(tl, "total"), "Total latency"),
                (charts.acceptance_over_time(tl), "Acceptance over time per model pair"),
            ],
        ),
        Section(
            "Acceptance by draft position",
            figures=[(charts.acceptance_by_position(curves), "Acceptance by draft position")],
        ),
        Section(
            "Speedup by segment",
            text="No shadow baselines in this window: measured speedup is unavailable; only "
            "tokens per target pass (the bound if drafting were free) is shown."
            if no_shadow
            else "Measured speedup: baseline over speculative generation time on shadow samples.",
            figures=[(charts.speedup_by_segment(report["groups"], keys), "Speedup by segment")],
        ),
        Section(
            "Slowest answers",
            text="Each with its trace id: open it in the trace backend to see where the time "
            "went (docs/operations.md, Tracing). Empty trace ids: tracing was off.",
            columns=list(report["slowest"][0]) if report.get("slowest") else [],
            rows=list(report.get("slowest") or []),
        ),
        Section(
            "Not traffic",
            text="One-shot `ask --local` answers, golden evaluations and benchmark runs: left out "
            "of every figure above."
            if non
            else "No one-shot, golden or benchmark queries.",
            columns=list(non[0]) if non else [],
            rows=non,
        ),
    ]
