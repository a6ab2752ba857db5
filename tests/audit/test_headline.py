"""The headline's statistics against numpy/brute force, and the headline with and without a
baseline in the window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from app.audit import render_report, units
from app.audit.stats import mcnemar_exact, quantile, quantile_ci, sign_flip_p
from app.db.schema import upgrade
from testkit.seeding import seed


def test_quantile_is_the_one_percentile_rule_percentile_cont() -> None:
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 100):
        xs = rng.normal(50.0, 10.0, n).tolist()  # unsorted: the rule sorts
        for p in (0.0, 0.5, 0.95, 0.99, 1.0):
            assert quantile(xs, p) == pytest.approx(float(np.percentile(xs, 100 * p)), abs=1e-9)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5  # the mean of the middle two
    assert quantile([], 0.95) is None


def test_quantile_refuses_a_percent_where_a_fraction_belongs() -> None:
    with pytest.raises(ValueError, match="p must be between 0 and 1"):
        quantile([1.0, 2.0], 95)


def test_batch_reports_use_the_same_rule() -> None:
    from app.batch.report import _pct

    xs = [float(v) for v in (12, 3, 40, 7, 25, 18)]
    assert _pct(xs, 95) == round(float(np.percentile(xs, 95)), 3)
    assert _pct([], 50) is None


def test_quantile_and_its_interval_cover_the_true_value() -> None:
    rng = np.random.default_rng(0)
    misses = 0
    for _ in range(200):
        xs = sorted(rng.exponential(100.0, 300).tolist())
        assert abs(quantile(xs, 0.95) - np.percentile(xs, 95)) < 1e-9  # type: ignore[operator]
        lo, hi = quantile_ci(xs, 0.95)
        true = -100.0 * np.log(0.05)
        misses += not (lo is not None and hi is not None and lo <= true <= hi)
    assert misses <= 20  # 95 % coverage: about 10 misses in 200
    assert quantile_ci(list(range(30)), 0.95)[1] is None  # too few for a P95's upper bound


def test_paired_tests() -> None:
    assert mcnemar_exact([(True, True)] * 10) == 1.0
    # 10 discordant pairs all one way: p = 2 / 2**10.
    assert abs(mcnemar_exact([(True, False)] * 10) - 2 / 1024) < 1e-12
    assert sign_flip_p([0.0] * 8) == 1.0
    assert sign_flip_p([0.1] * 10) < 0.01
    assert sign_flip_p([0.1, -0.1] * 10) == 1.0


def _report(tmp_path: Path, *, none_share: bool, shadow: float) -> dict:
    engine = create_engine(f"sqlite:///{tmp_path}/h.db")
    upgrade(engine)
    start = datetime(2026, 5, 1, tzinfo=UTC)
    seeded = seed(engine, 400, start=start, span=timedelta(hours=1), seed=7, shadow_share=shadow)
    if not none_share:
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM queries WHERE params LIKE '%\"none\"%'")
    with Session(engine) as session:
        _, body = render_report(
            session, since=start.isoformat(), until=(start + timedelta(hours=1)).isoformat()
        )
    engine.dispose()
    return {"report": json.loads(body), "seeded": seeded}


def test_headline_with_shadow_and_none_baselines(tmp_path: Path) -> None:
    out = _report(tmp_path, none_share=True, shadow=0.3)
    h, seeded = out["report"]["headline"], out["seeded"]
    spec = [
        r["total_ms"] for r in seeded.rows if r["status"] == "succeeded" and r["method"] != "none"
    ]
    assert abs(h["speculative"]["total_ms"]["p95"] - np.percentile(spec, 95)) < 1e-6
    lo, hi = h["speculative"]["total_ms"]["ci"]["p95"]
    assert lo <= h["speculative"]["total_ms"]["p95"] <= hi
    pairs = [r for r in seeded.rows if r.get("baseline_generation_ms")]
    assert h["baseline"]["sources"]["shadow"] == len(pairs)
    expected = sum(r["baseline_generation_ms"] for r in pairs) / sum(
        r["generation_ms"] for r in pairs
    )
    assert abs(h["speedup"]["value"] - expected) < 1e-9 and h["speedup"]["method"] == "shadow"
    assert h["speedup"]["ci"][0] <= expected <= h["speedup"]["ci"][1]
    assert out["report"]["timeline"]["bucket_seconds"] == 300  # a 1-hour window: 5-min points


def test_no_baseline_in_this_window(tmp_path: Path) -> None:
    h = _report(tmp_path, none_share=False, shadow=0.0)["report"]["headline"]
    assert h["baseline"]["available"] is False
    assert h["baseline"]["note"] == "no baseline in this window"
    assert h["speedup"]["value"] is None and h["speedup"]["note"] == "no baseline in this window"


def test_units_are_plain() -> None:
    assert units.ms(16020.0) == "16.02 s" and units.ms(84.2) == "84 ms"
    assert units.count(104233) == "104,233" and units.share(0.6831) == "68.3 %"
    assert units.number(0.00001234, 2) == "0.000012"


def test_alerts_acceptance_falling_and_speculation_slower(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/a.db")
    upgrade(engine)
    start, half = datetime(2026, 5, 2, tzinfo=UTC), timedelta(hours=12)
    seed(engine, 600, start=start, span=half, seed=1, accept_p=0.9, shadow_share=0.3)
    seed(engine, 600, start=start + half, span=half, seed=2, accept_p=0.4, shadow_share=0.3)
    with Session(engine) as session:
        window = {"since": start.isoformat(), "until": (start + 2 * half).isoformat()}
        before = json.loads(render_report(session, **window)[1])
        # Baselines twice as fast as the speculative answers: speculation does not pay.
        session.execute(
            text(
                "UPDATE shadow_runs SET baseline_generation_ms = 0.5 * (SELECT generation_ms "
                "FROM generation_stats g WHERE g.query_id = shadow_runs.query_id)"
            )
        )
        session.commit()
        after = json.loads(render_report(session, **window)[1])
    engine.dispose()
    falling = [a for a in before["alerts"] if a["kind"] == "acceptance_falling"]
    assert {a["group"]["model_pair"] for a in falling} == {"target-a+draft-a", "target-b+draft-b"}
    assert not [a for a in before["alerts"] if a["kind"] == "speculation_slower"]
    slower = [a for a in after["alerts"] if a["kind"] == "speculation_slower"]
    assert slower and slower[0]["group"] == {} and "0.50x" in slower[0]["message"]
    pairs = after["timeline"]["acceptance_by_pair"]
    # The step: each pair's acceptance is far lower in every bucket of the second half.
    for series in pairs:
        rates = [p["acceptance_rate"] for p in series["points"]]
        assert min(rates[: len(rates) // 2 - 1]) > max(rates[len(rates) // 2 + 1 :])


def test_delta_method_ratio_interval_matches_the_bootstrap() -> None:
    from app.audit.stats import bootstrap_ratio_ci, ratio_ci

    rng = np.random.default_rng(3)
    spec = rng.gamma(4.0, 100.0, 500)
    base = spec * rng.uniform(0.8, 2.5, 500)
    lo, hi, _ = ratio_ci(500, base.sum(), spec.sum(), (base * base).sum(), (spec * spec).sum(),
                         (base * spec).sum())  # fmt: skip
    blo, bhi = bootstrap_ratio_ci(base.tolist(), spec.tolist(), resamples=2000)
    assert lo is not None and hi is not None and blo is not None and bhi is not None
    assert abs(lo - blo) < 0.02 and abs(hi - bhi) < 0.02
