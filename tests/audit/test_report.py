"""The audit report's numbers, computed in SQL, against numpy on the seeded rows (both dialects)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from app.audit import Thresholds, build_report, parse_window, render_report
from app.audit.aggregate import LATENCY_METRICS
from tests.audit.conftest import COLLAPSE, DAY, DIRTY, MAIN, AuditDB

PCTS = {"p50": 50, "p95": 95, "p99": 99}


def report(db: AuditDB, start: Any, group_by: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    with Session(db.engine) as session:
        return build_report(session, parse_window(start, start + DAY), group_by, **kw)


def check_percentiles(got: dict[str, dict[str, float | None]], rows: list[dict]) -> None:
    for metric in LATENCY_METRICS:
        values = np.array([r[f"{metric}_ms"] for r in rows if r["status"] == "succeeded"])
        want = np.percentile(values, list(PCTS.values()))  # numpy's default is percentile_cont's
        for (name, _), w in zip(PCTS.items(), want, strict=True):
            assert got[metric][name] == pytest.approx(w, rel=1e-9), (metric, name)


def test_totals_percentiles_and_acceptance_match_numpy(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN)
    rows = audit_db.main.rows
    ok = [x for x in rows if x["status"] == "succeeded"]
    assert r["requests"] == len(rows) == 3000  # two sources per answer: still counted once
    assert r["succeeded"] == len(ok) and r["failed"] == len(rows) - len(ok)
    check_percentiles(r["latency_ms"], rows)
    drafts = sum(x["num_drafts"] for x in ok)
    accepted = sum(x["num_accepted_tokens"] for x in ok)
    assert r["acceptance_rate"] == pytest.approx(accepted / sum(x["num_draft_tokens"] for x in ok))
    assert r["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    per_pos = np.sum([x["accepted_per_position"] for x in ok if x["accepted_per_position"]], 0)
    assert [c["accepted"] for c in r["acceptance_curve"]] == per_pos.tolist()
    assert [c["rate"] for c in r["acceptance_curve"]] == pytest.approx(per_pos / drafts)
    spec = [x for x in ok if x["method"] != "none"]
    loss = [x for x in spec if x["num_drafts"] and x["num_accepted_tokens"] < x["num_drafts"]]
    assert 0 < len(loss) < len(spec)
    assert r["net_loss_share"] == pytest.approx(len(loss) / len(spec))
    tps = sum(x["num_output_tokens"] for x in ok) / sum(x["generation_ms"] for x in ok) * 1000
    assert r["output_tokens_per_s"] == pytest.approx(tps)


def test_groups_partition_the_window_and_match_numpy(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN, ("tenant", "method"))
    assert len(r["groups"]) == 6
    assert sum(g["requests"] for g in r["groups"]) == r["requests"]
    for g in r["groups"]:
        rows = [
            x
            for x in audit_db.main.rows
            if (x["tenant"], x["method"]) == (g["tenant"], g["method"])
        ]
        assert g["requests"] == len(rows)
        check_percentiles(g["latency_ms"], rows)
        if g["method"] == "none":
            assert g["acceptance_rate"] is None and g["acceptance_curve"] == []
            assert g["net_loss_share"] is None


def _batch_bucket(value: float | None) -> str | None:
    """The report's batch_size label, computed independently of its SQL."""
    if value is None:
        return None
    for edge, label in ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16"), (32, "17-32")):
        if value < edge + 0.5:
            return label
    return "33+"


def test_groups_by_load_and_chosen_k_match_numpy(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN, ("batch_size", "chosen_k"))
    ok = [x for x in audit_db.main.rows if x["status"] == "succeeded"]
    assert sum(g["requests"] for g in r["groups"]) == r["requests"]
    labels = {g["batch_size"] for g in r["groups"]}
    assert {"1", "2", "3-4", "5-8", "9-16", "17-32"} >= labels - {None} and None in labels
    for g in r["groups"]:
        rows = [
            x
            for x in ok
            if _batch_bucket(x["mean_batch_size"]) == g["batch_size"]
            and (None if x["mean_chosen_k"] is None else str(round(x["mean_chosen_k"])))
            == g["chosen_k"]
        ]
        sizes = [x["mean_batch_size"] for x in rows if x["mean_batch_size"] is not None]
        ks = [x["mean_chosen_k"] for x in rows if x["mean_chosen_k"] is not None]
        assert g["succeeded"] == len(rows), (g["batch_size"], g["chosen_k"])
        assert g["mean_batch_size"] == (pytest.approx(np.mean(sizes)) if sizes else None)
        assert g["mean_chosen_k"] == (pytest.approx(np.mean(ks)) if ks else None)
    sizes = [x["mean_batch_size"] for x in ok if x["mean_batch_size"] is not None]
    assert r["mean_batch_size"] == pytest.approx(np.mean(sizes))


def test_groups_by_dtype_count_each_answer_once(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN, ("dtype",))
    ok = [x for x in audit_db.main.rows if x["status"] == "succeeded"]
    got = {g["dtype"]: g["succeeded"] for g in r["groups"]}
    want = {d: sum(x["dtype"] == d for x in ok) for d in ("float32", "bfloat16", None)}
    assert got == want and all(want.values())


def test_groups_by_prompt_format_count_each_answer_once(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN, ("prompt_format",))
    ok = [x for x in audit_db.main.rows if x["status"] == "succeeded"]
    got = {g["prompt_format"]: g["succeeded"] for g in r["groups"]}
    want = {f: sum(x["prompt_format"] == f for x in ok) for f in ("chat", "raw", None)}
    assert got == want and all(want.values())


def test_prefix_cache_hit_rate_matches_numpy(audit_db: AuditDB) -> None:
    """vLLM's queries / hits: prompt tokens of answers that recorded a figure, tokens reused."""
    r = report(audit_db, MAIN, ("method",))
    ok = [x for x in audit_db.main.rows if x["status"] == "succeeded"]
    known = [x for x in ok if x["num_cached_prompt_tokens"] is not None]
    assert 0 < len(known) < len(ok)  # rows from before migration 0010 are left out of both
    queries = sum(x["prompt_tokens"] for x in known)
    hits = sum(x["num_cached_prompt_tokens"] for x in known)
    assert r["prefix_cache"] == {
        "queries": queries,
        "hits": hits,
        "hit_rate": pytest.approx(hits / queries),
    }
    assert sum(g["prefix_cache"]["hits"] for g in r["groups"]) == hits
    for g in r["groups"]:
        rows = [x for x in known if x["method"] == g["method"]]
        assert g["prefix_cache"]["queries"] == sum(x["prompt_tokens"] for x in rows)


def test_shadow_speedup_and_exactness(audit_db: AuditDB) -> None:
    clean = report(audit_db, MAIN, ("method",))
    shadows = [x for x in audit_db.main.rows if x.get("baseline_generation_ms")]
    assert clean["shadow"]["samples"] == len(shadows) > 100
    want = sum(x["baseline_generation_ms"] for x in shadows) / sum(
        x["generation_ms"] for x in shadows
    )
    assert clean["shadow"]["speedup"] == pytest.approx(want)
    assert clean["shadow"]["exactness_violations"] == 0
    assert not [a for a in clean["alerts"] if a["kind"] == "exactness_violation"]

    dirty = report(audit_db, DIRTY, ("method",))
    bad = sum(x.get("mismatched_tokens", 0) for x in audit_db.dirty.rows)
    assert bad > 0 and dirty["shadow"]["exactness_violations"] == bad
    top = [a for a in dirty["alerts"] if a["kind"] == "exactness_violation" and not a["group"]]
    assert top and top[0]["severity"] == "critical"


def test_latency_regression_and_acceptance_collapse_alerts(audit_db: AuditDB) -> None:
    main = report(audit_db, MAIN)
    # The previous day ran at half the latency: P95 total roughly doubled.
    assert [a["kind"] for a in main["alerts"] if not a["group"]] == ["latency_regression"]
    prev = report(audit_db, MAIN - DAY)
    assert not [a for a in prev["alerts"] if a["kind"] == "latency_regression"]

    collapsed = report(audit_db, COLLAPSE)
    kinds = [a["kind"] for a in collapsed["alerts"] if not a["group"]]
    assert "acceptance_collapse" in kinds and "trailing week" in collapsed["alerts"][0]["message"]
    relaxed = report(audit_db, COLLAPSE, thresholds=Thresholds(collapse_ratio=0.3))
    assert "acceptance_collapse" not in [a["kind"] for a in relaxed["alerts"]]


def test_timeline_buckets_add_up_and_match_numpy(audit_db: AuditDB) -> None:
    r = report(audit_db, MAIN)
    points = r["timeline"]["points"]
    assert r["timeline"]["bucket_seconds"] == 3600 and len(points) == 24
    assert sum(p["requests"] for p in points) == r["requests"]
    for hour in (0, 13, 23):
        lo, hi = MAIN + timedelta(hours=hour), MAIN + timedelta(hours=hour + 1)
        rows = [x for x in audit_db.main.rows if lo <= x["queued_at"] < hi]
        assert points[hour]["start"] == lo.isoformat() and points[hour]["requests"] == len(rows)
        total = [x["total_ms"] for x in rows if x["status"] == "succeeded"]
        want = np.percentile(total, [50, 95, 99])
        got = points[hour]["latency_ms"]["total"]
        assert [got["p50"], got["p95"], got["p99"]] == pytest.approx(want, rel=1e-9)


def test_empty_window_says_so(audit_db: AuditDB) -> None:
    with Session(audit_db.engine) as session:
        _, body = render_report(session, since="2030-01-01", until="2030-01-02")
        r = json.loads(body)
        assert r["empty"] and r["requests"] == 0 and r["groups"] == []
        assert "no requests" in r["note"]
        assert r["latency_ms"]["total"] == {"p50": None, "p95": None, "p99": None}
        _, html = render_report(session, since="2030-01-01", until="2030-01-02", fmt="html")
        assert "Empty report" in html


def test_csv_is_the_json_flattened(audit_db: AuditDB) -> None:
    with Session(audit_db.engine) as session:
        since, until = MAIN.isoformat(), (MAIN + DAY).isoformat()
        r = json.loads(render_report(session, since=since, until=until, group_by="tenant")[1])
        media, body = render_report(session, since=since, until=until, fmt="csv", group_by="tenant")
    assert media.startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body)))
    assert len(rows) == 1 + len(r["groups"]) and rows[0]["tenant"] == "(all)"
    assert int(rows[0]["requests"]) == r["requests"]
    assert float(rows[1]["total_ms_p95"]) == pytest.approx(
        r["groups"][0]["latency_ms"]["total"]["p95"]
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"since": "2026-03-11", "until": "2026-03-10"}, "since"),
        ({"since": "2026-03-10", "until": "2026-03-10"}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"fmt": "pdf"}, "format"),
        ({"group_by": "tenant,colour"}, "group_by"),
    ],
)
def test_bad_input_names_the_field(audit_db: AuditDB, kwargs: dict, field: str) -> None:
    if audit_db.dialect != "sqlite":
        pytest.skip("input validation does not touch the database; checked once")
    with Session(audit_db.engine) as session, pytest.raises(ValueError, match=f"^{field}: "):
        render_report(session, **kwargs)


def test_window_defaults_to_the_last_day() -> None:
    w = parse_window(None, "2026-03-10T12:00:00+02:00")
    assert w.until.isoformat() == "2026-03-10T10:00:00+00:00" and w.span == timedelta(days=1)


def test_the_slowest_answers_carry_their_trace_ids(audit_db: AuditDB) -> None:
    import uuid

    from sqlalchemy import update

    from app.audit.formats import render
    from app.db import GenerationStatsRecord

    before = report(audit_db, MAIN)["slowest"]
    ok = sorted(
        (x["total_ms"] for x in audit_db.main.rows if x["status"] == "succeeded"), reverse=True
    )
    assert [s["total_ms"] for s in before] == pytest.approx(ok[:10])
    assert all(s["trace_id"] is None for s in before)  # seeded without tracing
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with Session(audit_db.engine) as session:
        session.execute(
            update(GenerationStatsRecord)
            .where(GenerationStatsRecord.query_id == uuid.UUID(before[0]["query_id"]))
            .values(trace_id=trace_id)
        )
        session.commit()
    try:
        after = report(audit_db, MAIN)
        assert after["slowest"][0]["trace_id"] == trace_id
        html = render(after, "html")[1]
        assert trace_id in html and "Slowest answers" in html
    finally:
        with Session(audit_db.engine) as session:
            session.execute(update(GenerationStatsRecord).values(trace_id=None))
            session.commit()
