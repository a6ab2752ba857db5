"""The quality verdict of a golden run: speculative vs greedy baseline, paired, with p-values.

Each golden item is answered twice (with speculation and with method ``none``), so every metric
comes in pairs and the tests are paired (``app.audit.stats``): exact McNemar for exact match,
a sign-flip permutation test for token F1 and faithfulness. The verdict is "no significant
difference" when every p-value is at least ``ALPHA``; otherwise it names each metric that
differs, with its difference and p-value.

Runs stored before migration 0012 scored only the speculative answer: exact match and F1 of the
baseline are then computed from its stored text, and its faithfulness is taken as the
speculative answer's where the two answers are identical (same text, same passages), left out
elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audit.records import GoldenItem, GoldenRun
from app.audit.stats import mcnemar_exact, sign_flip_p
from app.audit.window import Window
from app.scoring import exact_match, token_f1

ALPHA = 0.05
NO_DIFFERENCE = "no significant difference"
METRICS: dict[str, tuple[str, str]] = {
    "exact_match": ("exact_match", "exact McNemar"),
    "token_f1": ("token_f1", "paired sign-flip permutation"),
    "faithfulness": ("faithfulness", "paired sign-flip permutation"),
}


def _baseline(item: GoldenItem, name: str) -> Any:
    stored = getattr(item, f"baseline_{name}")
    if stored is not None:
        return stored
    if item.baseline_answer is None:
        return None
    if name == "exact_match":
        return exact_match(item.baseline_answer, item.reference)
    if name == "token_f1":
        return token_f1(item.baseline_answer, item.reference)
    return item.faithfulness if item.identical else None


def compare_items(items: list[GoldenItem]) -> dict[str, Any]:
    """Per metric: n pairs, speculative and baseline means, difference, test, p-value."""
    out: dict[str, Any] = {}
    for name, (column, test) in METRICS.items():
        pairs = [
            (getattr(i, column), _baseline(i, name))
            for i in items
            if i.error is None and getattr(i, column) is not None
        ]
        pairs = [(a, b) for a, b in pairs if b is not None]
        if not pairs:
            out[name] = {"n": 0, "speculative": None, "baseline": None, "difference": None,
                         "test": test, "p_value": None}  # fmt: skip
            continue
        as_float: Callable[[Any], float] = float
        spec = sum(as_float(a) for a, _ in pairs) / len(pairs)
        base = sum(as_float(b) for _, b in pairs) / len(pairs)
        if name == "exact_match":
            p = mcnemar_exact([(bool(a), bool(b)) for a, b in pairs])
        else:
            p = sign_flip_p([float(a) - float(b) for a, b in pairs])
        out[name] = {"n": len(pairs), "speculative": spec, "baseline": base,
                     "difference": spec - base, "test": test, "p_value": p}  # fmt: skip
    return out


def verdict(metrics: dict[str, Any]) -> str:
    """ "no significant difference", or each differing metric with its difference and p."""
    differing = [
        f"{name} {m['difference']:+.3f} (p = {m['p_value']:.3f})"
        for name, m in metrics.items()
        if m["p_value"] is not None and m["p_value"] < ALPHA
    ]
    if not any(m["n"] for m in metrics.values()):
        return "no scored items"
    return "significant difference: " + ", ".join(differing) if differing else NO_DIFFERENCE


def latest_verdict(session: Session, window: Window) -> dict[str, Any]:
    """The newest golden run created before the window's end, compared pair by pair."""
    run = session.scalars(
        select(GoldenRun)
        .where(GoldenRun.created_at < window.until)
        .order_by(GoldenRun.created_at.desc())
        .limit(1)
    ).first()
    if run is None:
        return {"run_id": None, "verdict": "no golden run yet", "metrics": {}}
    items = list(session.scalars(select(GoldenItem).where(GoldenItem.run_id == run.id)))
    metrics = compare_items(items)
    return {
        "run_id": str(run.id),
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "method": run.method,
        "model_pair": run.model_pair,
        "items": len(items),
        "alpha": ALPHA,
        "verdict": verdict(metrics),
        "metrics": metrics,
    }
