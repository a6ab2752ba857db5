"""The report's headline: speculative latency beside the no-speculation baseline, the measured
speedup, acceptance, and the latest golden comparison's verdict (JSON ``headline``).

**Baseline.** Two sources of answers decoded without speculation, pooled and counted apart:
*shadow* re-decodes of sampled speculative answers (same prompt, method ``none``; their total
latency is the answer's own with its generation time swapped for the baseline's, since queueing
and retrieval do not depend on the method) and *none traffic* (answers asked with method
``none``). TTFT is measured from the start of generation for both.

**Speedup.** Paired where shadow samples exist: Σ baseline / Σ speculative generation time over
the samples. Otherwise, from ``none`` traffic: speculative output tokens per generation second
over ``none``'s (different prompts and lengths, so tokens per second, not latency). Each with a
95 % interval (delta method, ``app.audit.stats``). Everything is computed by the database
(percentiles, the order statistics bounding them, sums): 100k rows never travel to Python. A window with neither says "no baseline in this
window".
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Float, FromClause, and_, case, cast, func, literal, or_, select, union_all
from sqlalchemy.orm import Session

from app.audit.golden_verdict import latest_verdict
from app.audit.sql import percentiles
from app.audit.stats import quantile_ci_ranks, ratio_ci
from app.audit.window import Window

NO_BASELINE = "no baseline in this window"
PERCENTILES = {"p50": 0.5, "p95": 0.95}
METRICS = ("total", "ttft")


def populations(b: FromClause) -> FromClause:
    """(pop, total, ttft) per answer: ``spec`` answers, and the ``base``line pooled from
    method-none answers and shadow re-decodes (the answer's time with the baseline's generation)."""
    c = b.c
    answered = and_(c.status == "succeeded", c.stats_id.is_not(None))
    shadow = and_(answered, c.method != "none", c.shadow_status == "done",
                  c.generation_ms > 0, c.baseline_generation_ms > 0)  # fmt: skip
    spec = select(literal("spec").label("pop"), c.total_ms.label("total"), c.ttft_ms.label("ttft"))
    none = select(literal("base").label("pop"), c.total_ms, c.ttft_ms)
    swapped = c.total_ms - c.generation_ms + c.baseline_generation_ms
    shadows = select(literal("base").label("pop"), swapped, c.baseline_ttft_ms)
    return union_all(
        spec.where(answered, c.method != "none"),
        none.where(answered, c.method == "none"),
        shadows.where(shadow),
    ).subquery("pops")


def _latency(session: Session, v: FromClause) -> dict[str, dict[str, dict[str, Any]]]:
    """{pop: {metric: {"n", "p50", "p95", "ci"}}}: percentiles and their order-statistic CIs."""
    counts = select(v.c.pop, *(func.count(v.c[m]).label(m) for m in METRICS)).group_by(v.c.pop)
    n = {row.pop: {m: int(getattr(row, m)) for m in METRICS} for row in session.execute(counts)}
    points = percentiles(session, v, ["pop"], {m: m for m in METRICS})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for pop in ("spec", "base"):
        out[pop] = {}
        for m in METRICS:
            pct = points.get((pop,), {}).get(m, {})
            ranks = {
                k: quantile_ci_ranks(n.get(pop, {}).get(m, 0), p) for k, p in PERCENTILES.items()
            }
            out[pop][m] = {"n": n.get(pop, {}).get(m, 0), **{k: pct.get(k) for k in PERCENTILES},
                           "ci": ranks}  # fmt: skip
    for m in METRICS:  # the bounds: the order statistics at those ranks, one query per metric
        wanted = {(pop, r) for pop in out for lo_hi in out[pop][m]["ci"].values()
                  for r in lo_hi if r is not None}  # fmt: skip
        if not wanted:
            continue
        rn = func.row_number().over(partition_by=v.c.pop, order_by=v.c[m])
        ranked = select(v.c.pop, v.c[m].label("x"), rn.label("rn")).where(v.c[m].is_not(None))
        r = ranked.subquery("ranked")
        cond = or_(*(and_(r.c.pop == pop, r.c.rn.in_(sorted(k for p, k in wanted if p == pop)))
                     for pop in {p for p, _ in wanted}))  # fmt: skip
        values = {
            (row.pop, int(row.rn)): float(row.x) for row in session.execute(select(r).where(cond))
        }
        for pop in out:
            cis = out[pop][m]["ci"]
            out[pop][m]["ci"] = {k: [values.get((pop, lo)) if lo else None,
                                     values.get((pop, hi)) if hi else None]
                                 for k, (lo, hi) in cis.items()}  # fmt: skip
    return out


def _sums(session: Session, b: FromClause) -> dict[str, float]:
    """The sums behind the speedup and its interval: shadow pairs, and token rates per method."""
    c = b.c
    answered = and_(c.status == "succeeded", c.stats_id.is_not(None))
    timed = and_(answered, c.generation_ms > 0, c.num_output_tokens.is_not(None))
    pair = and_(timed, c.method != "none", c.shadow_status == "done", c.baseline_generation_ms > 0)
    tok = cast(c.num_output_tokens, Float)
    cols = {}
    for name, cond, x, y in (("pair", pair, c.baseline_generation_ms, c.generation_ms),
                             ("spec", and_(timed, c.method != "none"), tok, c.generation_ms),
                             ("none", and_(timed, c.method == "none"), tok, c.generation_ms)):  # fmt: skip
        cols[f"{name}_n"] = func.sum(case((cond, 1), else_=0))
        for term, expr in (("x", x), ("y", y), ("xx", x * x), ("yy", y * y), ("xy", x * y)):
            cols[f"{name}_{term}"] = func.sum(case((cond, expr), else_=0.0))
    cols["none_rows"] = func.sum(case((and_(answered, c.method == "none"), 1), else_=0))
    row = session.execute(select(*(v.label(k) for k, v in cols.items()))).mappings().one()
    return {k: float(row[k] or 0) for k in cols}


def build_headline(
    session: Session, b: FromClause, window: Window, report: dict[str, Any]
) -> dict[str, Any]:
    """The headline block of ``report`` over the window's rows ``b`` (JSON-ready)."""
    v = populations(b)
    lat = _latency(session, v)
    sums = _sums(session, b)
    baseline_n = {"shadow": int(sums["pair_n"]), "none_traffic": int(sums["none_rows"])}
    has_baseline = lat["base"]["total"]["n"] > 0
    return {
        "speculative": {"total_ms": lat["spec"]["total"], "ttft_ms": lat["spec"]["ttft"]},
        "baseline": {
            "available": has_baseline,
            "note": None if has_baseline else NO_BASELINE,
            "sources": baseline_n,
            "total_ms": lat["base"]["total"] if has_baseline else None,
            "ttft_ms": lat["base"]["ttft"] if has_baseline else None,
        },
        "speedup": _speedup(sums),
        "acceptance_rate": report["acceptance_rate"],
        "mean_acceptance_length": report["mean_acceptance_length"],
        "groundedness": report["groundedness"],
        "citation_precision": report["citation_precision"],
        "grounded_answers": report["grounded_answers"],
        "speculative_requests": report["speculative_requests"],
        "quality": latest_verdict(session, window),
    }


def _ratio(sums: dict[str, float], name: str) -> tuple[float | None, float | None, float]:
    s = {k: sums[f"{name}_{k}"] for k in ("n", "x", "y", "xx", "yy", "xy")}
    return ratio_ci(int(s["n"]), s["x"], s["y"], s["xx"], s["yy"], s["xy"])


def _speedup(sums: dict[str, float]) -> dict[str, Any]:
    """The measured speedup, how it was measured, on how many answers, and its 95 % CI."""
    if sums["pair_n"] > 0 and sums["pair_y"] > 0:
        lo, hi, _ = _ratio(sums, "pair")
        return {
            "value": sums["pair_x"] / sums["pair_y"],
            "ci": [lo, hi],
            "method": "shadow",
            "n": int(sums["pair_n"]),
            "note": "baseline over speculative generation time, paired shadow re-decodes",
        }
    if sums["spec_n"] > 0 and sums["none_n"] > 0 and sums["none_x"] > 0:
        value = (sums["spec_x"] / sums["spec_y"]) / (sums["none_x"] / sums["none_y"])
        var = _ratio(sums, "spec")[2] + _ratio(sums, "none")[2]
        half = 1.959963984540054 * math.sqrt(var) if math.isfinite(var) else None
        return {
            "value": value,
            "ci": [value * math.exp(-half), value * math.exp(half)]
            if half is not None
            else [None, None],
            "method": "none_traffic",
            "n": int(sums["none_n"]),
            "note": "speculative over method-none output tokens per generation second",
        }
    return {"value": None, "ci": [None, None], "method": None, "n": 0, "note": NO_BASELINE}
