"""``groundedness_falling``: answers standing less on their sources than in the previous window.

Groundedness (docs/grounding.md) is the mean over answers of the share of their sentences that a
retrieved passage supports. An index rebuild, a re-chunking or a target swap that moves answers
away from the documents shows as a fall against the window of the same length just before; a
group (and the whole window) is compared when both windows hold ``min_samples`` grounded answers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

import app.audit.units as units
from app.audit.aggregate import base, counters
from app.audit.window import Window

GROUNDEDNESS_DROP = 0.1
"""A fall of more than this (absolute share) from the previous window is an alert."""


def _by_key(session: Session, window: Window, keys: list[str]) -> dict[Any, tuple[float, int]]:
    """Mean groundedness and grounded answers per key tuple (None: whole window)."""
    out: dict[Any, tuple[float, int]] = {}
    total_sum, total_n = 0.0, 0
    for key, c in counters(session, base(window), keys).items():
        n = int(c["grounded_n"] or 0)
        if n:
            out[key] = (float(c["groundedness_sum"]) / n, n)
            total_sum += float(c["groundedness_sum"])
            total_n += n
    if total_n:
        out[None] = (total_sum / total_n, total_n)
    return out


def groundedness_alerts(
    session: Session,
    window: Window,
    report: dict[str, Any],
    min_samples: int,
    drop: float = GROUNDEDNESS_DROP,
) -> list[dict[str, Any]]:
    """One warning per group (and for the whole window) whose groundedness fell by more than
    ``drop`` against the previous window, both with at least ``min_samples`` grounded answers."""
    keys = list(report["group_by"])
    previous = _by_key(session, window.previous(), keys)
    rows = [({}, report)] + [({k: g[k] for k in keys}, g) for g in report["groups"]]
    found = []
    for key, row in rows:
        now, n = row.get("groundedness"), row.get("grounded_answers", 0)
        was = previous.get(tuple(key.get(k) for k in keys) if key else None)
        if now is None or was is None or n < min_samples or was[1] < min_samples:
            continue
        if now < was[0] - drop:
            where = ", ".join(f"{k}={key[k]}" for k in keys if k in key) or "all traffic"
            found.append(
                {
                    "kind": "groundedness_falling",
                    "severity": "warning",
                    "group": key,
                    "message": f"{where}: groundedness {units.share(now)} vs "
                    f"{units.share(was[0])} in the previous window ({n} vs {was[1]} answers)",
                }
            )
    return found
