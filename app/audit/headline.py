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
95 % bootstrap interval (``app.audit.stats``). A window with neither says "no baseline in this
window".
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import FromClause, and_, select
from sqlalchemy.orm import Session

from app.audit.golden_verdict import latest_verdict
from app.audit.stats import bootstrap_ratio_ci, quantile, quantile_ci
from app.audit.window import Window

NO_BASELINE = "no baseline in this window"
PERCENTILES = {"p50": 0.5, "p95": 0.95}


def _latency(values: list[float]) -> dict[str, Any]:
    """``{"n", "p50", "p95", "ci": {"p50": [lo, hi], "p95": [lo, hi]}}`` of ``values`` (ms)."""
    values = sorted(values)
    out: dict[str, Any] = {"n": len(values)}
    ci: dict[str, list[float | None]] = {}
    for name, p in PERCENTILES.items():
        out[name] = quantile(values, p)
        ci[name] = list(quantile_ci(values, p))
    out["ci"] = ci
    return out


def _rows(session: Session, b: FromClause) -> list[Any]:
    """Answered queries' method, latencies, tokens and shadow baseline (one tuple each)."""
    c = b.c
    stmt = select(
        c.method,
        c.total_ms,
        c.ttft_ms,
        c.generation_ms,
        c.num_output_tokens,
        c.shadow_status,
        c.baseline_generation_ms,
        c.baseline_ttft_ms,
    ).where(and_(c.status == "succeeded", c.stats_id.is_not(None)))
    return list(session.execute(stmt))


def build_headline(
    session: Session, b: FromClause, window: Window, report: dict[str, Any]
) -> dict[str, Any]:
    """The headline block of ``report`` over the window's rows ``b`` (JSON-ready)."""
    spec_total, spec_ttft, none_total, none_ttft = [], [], [], []
    shadow_total, shadow_ttft, pairs_base, pairs_spec = [], [], [], []
    spec_tok, spec_ms, none_tok, none_ms = [], [], [], []
    for method, total, ttft, gen, tokens, sh_status, base_gen, base_ttft in _rows(session, b):
        timed = gen is not None and gen > 0 and tokens is not None
        if method == "none":
            none_total += [total] if total is not None else []
            none_ttft += [ttft] if ttft is not None else []
            if timed:
                none_tok.append(float(tokens))
                none_ms.append(float(gen))
            continue
        spec_total += [total] if total is not None else []
        spec_ttft += [ttft] if ttft is not None else []
        if timed:
            spec_tok.append(float(tokens))
            spec_ms.append(float(gen))
        if sh_status == "done" and timed and base_gen is not None and base_gen > 0:
            pairs_base.append(float(base_gen))
            pairs_spec.append(float(gen))
            if total is not None:
                shadow_total.append(total - gen + base_gen)
            if base_ttft is not None:
                shadow_ttft.append(base_ttft)
    baseline_n = {"shadow": len(pairs_base), "none_traffic": len(none_total)}
    has_baseline = any(baseline_n.values())
    return {
        "speculative": {
            "total_ms": _latency(spec_total),
            "ttft_ms": _latency(spec_ttft),
        },
        "baseline": {
            "available": has_baseline,
            "note": None if has_baseline else NO_BASELINE,
            "sources": baseline_n,
            "total_ms": _latency(none_total + shadow_total) if has_baseline else None,
            "ttft_ms": _latency(none_ttft + shadow_ttft) if has_baseline else None,
        },
        "speedup": _speedup(pairs_base, pairs_spec, (spec_tok, spec_ms), (none_tok, none_ms)),
        "acceptance_rate": report["acceptance_rate"],
        "mean_acceptance_length": report["mean_acceptance_length"],
        "speculative_requests": report["speculative_requests"],
        "quality": latest_verdict(session, window),
    }


def _speedup(
    base: list[float],
    spec: list[float],
    spec_rate: tuple[list[float], list[float]],
    none_rate: tuple[list[float], list[float]],
) -> dict[str, Any]:
    """The measured speedup, how it was measured, on how many answers, and its 95 % CI."""
    if base:
        lo, hi = bootstrap_ratio_ci(base, spec)
        return {
            "value": sum(base) / sum(spec),
            "ci": [lo, hi],
            "method": "shadow",
            "n": len(base),
            "note": "baseline over speculative generation time, paired shadow re-decodes",
        }
    (st, sm), (nt, nm) = spec_rate, none_rate
    if st and nt and sum(nt) > 0:
        lo, hi = bootstrap_ratio_ci(st, sm, other=(nt, nm))
        return {
            "value": (sum(st) / sum(sm)) / (sum(nt) / sum(nm)),
            "ci": [lo, hi],
            "method": "none_traffic",
            "n": len(nt),
            "note": "speculative over method-none output tokens per generation second",
        }
    return {"value": None, "ci": [None, None], "method": None, "n": 0, "note": NO_BASELINE}
