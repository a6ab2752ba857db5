"""Human grades end to end: a real golden run, exported (CSV and HTML form), graded, imported
through the CLI, refused line by line when wrong (nothing stored), and reported: agreement with
the automatic score, graded figures in `eval compare`, and the golden verdict of the report."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import func, select

from app.audit.golden_verdict import NO_DIFFERENCE, latest_verdict
from app.audit.window import parse_window
from app.cli import main
from app.evals.golden import read_golden, run_golden
from app.grading import GoldenGrade, graded_summary
from app.grading.agreement import automatic_label
from tests.audit.conftest import Live
from tests.audit.test_golden import ITEMS, write


def _env(live: Live) -> dict[str, str]:
    s = live.settings
    return {"SPECRAG_DATA_DIR": str(s.data_dir), "SPECRAG_TARGET_MODEL": str(s.target_model),
            "SPECRAG_DRAFT_MODEL": str(s.draft_model), "SPECRAG_DEVICE": "cpu"}  # fmt: skip


def _grades(session_factory) -> int:  # type: ignore[no-untyped-def]
    with session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(GoldenGrade)) or 0)


def test_export_grade_import_and_report(live: Live, tmp_path: Path) -> None:
    items = read_golden(write(tmp_path / "g.jsonl", [json.dumps(i) for i in ITEMS]), "docs")
    run = run_golden(live.resources, items, source_file="g.jsonl", tenant="acme")
    runner, env = CliRunner(), _env(live)
    out_csv, out_html = tmp_path / "items.csv", tmp_path / "form.html"
    for fmt, out in (("csv", out_csv), ("html", out_html)):
        res = runner.invoke(main, ["eval", "grades", "export", run["run_id"][:8],
                                   "--format", fmt, "--out", str(out)], env=env)  # fmt: skip
        assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text(encoding="utf-8"))))
    assert [r["line_no"] for r in rows] == ["1", "2", "3"]
    assert all(r["passages"].startswith("[1] ") and r["faithful"] == "" for r in rows)
    form = out_html.read_text(encoding="utf-8")
    assert form.count("<article") == 3 and "http://" not in form and "Save grades.csv" in form
    ids = [int(r["item_id"]) for r in rows]
    sf = live.resources.session_factory

    # Wrong files: every bad line named with its reason, nothing stored.
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "item_id,faithful,relevance,note\r\n"
        f"{ids[0]},faithful,5,ok\r\n"
        "999999,faithful,4,\r\n"
        f"{ids[1]},mostly,3,\r\n"
        f"{ids[2]},not,9,\r\n"
        f"{ids[0]},partly,2,again\r\n",
        encoding="utf-8",
    )
    res = runner.invoke(main, ["eval", "grades", "import", str(bad)], env=env)
    assert res.exit_code == 1
    for line, reason in (
        (3, "item_id: unknown item id 999999"),
        (4, "faithful: 'mostly' is not one of"),
        (5, "relevance: '9' is outside the scale 1-5"),
        (6, f"duplicate grade of item {ids[0]} by 'default' (first on line 2)"),
    ):
        assert f"line {line}: {reason}" in res.output, res.output  # fmt: skip
    assert "line 2:" not in res.output and "nothing stored" in res.output
    assert _grades(sf) == 0

    good = tmp_path / "grades.csv"
    good.write_text(
        "item_id,faithful,relevance,note\r\n"
        f'{ids[0]},faithful,5,"cites [1], fine"\r\n'
        f"{ids[1]},partly,3,\r\n"
        f"{ids[2]},,,\r\n",  # left ungraded: skipped, not refused
        encoding="utf-8",
    )
    res = runner.invoke(main, ["eval", "grades", "import", str(good), "--grader", "ann",
                               "--json"], env=env)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["stored"] == 2 and _grades(sf) == 2
    again = runner.invoke(main, ["eval", "grades", "import", str(good), "--grader", "ann"], env=env)
    assert again.exit_code == 1 and f"item {ids[0]} is already graded by 'ann'" in again.output
    assert _grades(sf) == 2

    with sf() as session:
        import uuid

        summary = graded_summary(session, uuid.UUID(run["run_id"]))
        verdict = latest_verdict(session, parse_window(None, None))
    assert summary["grades"] == 2 and summary["graders"] == ["ann"]
    assert summary["human_faithfulness"] == 0.75 and summary["relevance"] == 4.0
    assert summary["agreement"]["n"] == 2
    # Greedy decoding: both answers identical, so no metric can differ between them.
    assert verdict["run_id"] == run["run_id"] and verdict["verdict"] == NO_DIFFERENCE
    assert verdict["metrics"]["exact_match"]["p_value"] == 1.0
    cmp = runner.invoke(main, ["eval", "compare", run["run_id"], run["run_id"]], env=env)
    assert cmp.exit_code == 0 and "human_faithfulness" in cmp.output and "by ann" in cmp.output


def test_automatic_label() -> None:
    assert [automatic_label(x) for x in (1.0, 0.5, 0.0)] == ["faithful", "partly", "not"]
