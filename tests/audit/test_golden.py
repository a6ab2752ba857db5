"""Golden evaluations end to end (tiny models, MiniLM, FAISS, app.pipeline) and their metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from app.audit.records import GoldenItem, ShadowRun
from app.cli import main
from app.db.models import Query
from app.evals.golden import compare_runs, read_golden, run_golden
from app.scoring import exact_match, faithfulness, retrieval_recall, sentences, token_f1
from tests.audit.conftest import Live

ITEMS = [
    {"question": "What does the assert statement do?", "reference": "It checks a condition.",
     "expected_sources": ["assert.md"]},
    {"question": "What is the pass statement for?", "reference": "It does nothing.",
     "expected_sources": ["pass.md"], "collection": "docs"},
    {"question": "How do I delete a name?", "reference": "Use del.", "expected_source": "del.md"},
]  # fmt: skip


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_run_scores_stores_and_compares(live: Live, tmp_path: Path) -> None:
    items = read_golden(write(tmp_path / "g.jsonl", [json.dumps(i) for i in ITEMS]), "docs")
    assert [i.line_no for i in items] == [1, 2, 3] and items[2].expected_sources == ["del.md"]
    res = live.resources
    first = run_golden(res, items, source_file="g.jsonl", tenant="acme", method="draft_model")
    second = run_golden(res, items[:2], source_file="g.jsonl", tenant="acme", method="ngram")
    assert first["items"] == 3 and first["errors"] == 0
    # Greedy decoding: speculation must not change a single answer.
    assert first["identical_rate"] == 1.0 and second["identical_rate"] == 1.0
    # Real MiniLM retrieval finds each question's own file among the cited passages.
    assert first["retrieval_recall"] == 1.0
    assert 0.0 <= first["token_f1"] <= 1.0 and 0.0 <= first["faithfulness"] <= 1.0
    assert first["spec_total_ms"]["p50"] > 0 and first["baseline_total_ms"]["p50"] > 0
    with res.session_factory() as session:
        rows = session.scalars(select(GoldenItem).order_by(GoldenItem.line_no)).all()
        mine = [r for r in rows if str(r.run_id) == first["run_id"]]
        assert [r.line_no for r in mine] == [1, 2, 3]
        assert all(r.spec_answer == r.baseline_answer for r in mine)
        # Golden queries are stored on the eval queue, never shadow-sampled.
        eval_ids = [r.spec_query_id for r in mine]
        queues = set(session.scalars(select(Query.queue).where(Query.id.in_(eval_ids))))
        shadows = session.scalar(
            select(func.count()).select_from(ShadowRun).where(ShadowRun.query_id.in_(eval_ids))
        )
        assert queues == {"eval"} and shadows == 0
        diff = compare_runs(session, first["run_id"], second["run_id"][:8])
    assert diff["common_items"] == 2
    # Both methods give the same greedy answers, so no common item's scores can move.
    assert diff["changed_items"] == []
    for name in ("retrieval_recall", "identical_rate"):
        assert diff["metrics"][name]["delta"] == pytest.approx(0.0), name
    with res.session_factory() as session:
        # A regression in one item of run B must show up as that item, with both scores.
        item = session.scalars(
            select(GoldenItem).where(GoldenItem.line_no == 1).order_by(GoldenItem.id.desc())
        ).first()
        assert item is not None and str(item.run_id) == second["run_id"]
        before = item.token_f1
        item.token_f1 = 0.25 if before != 0.25 else 0.5
        session.commit()
        changed = compare_runs(session, first["run_id"], second["run_id"])["changed_items"]
    assert [c["line_b"] for c in changed] == [1]
    assert changed[0]["token_f1"] == {"a": before, "b": item.token_f1}


def test_malformed_lines_are_named(tmp_path: Path) -> None:
    lines = [
        json.dumps(ITEMS[0]),
        "{not json",
        json.dumps({"question": "", "reference": "x"}),
        json.dumps(
            {"question": "q", "reference": "x", "expected_sources": "a.md", "collection": 3}
        ),
        json.dumps({"question": "q"}),
    ]
    with pytest.raises(ValueError) as info:
        read_golden(write(tmp_path / "bad.jsonl", lines), "docs")
    msg = str(info.value)
    assert "4 malformed line(s)" in msg
    for n in (2, 3, 4, 5):
        assert f"line {n}:" in msg
    assert "line 1:" not in msg
    with pytest.raises(ValueError, match="line 1: needs a 'collection'"):
        read_golden(write(tmp_path / "nocoll.jsonl", [json.dumps(ITEMS[0])]), None)
    with pytest.raises(ValueError, match="no golden items"):
        read_golden(write(tmp_path / "empty.jsonl", [""]), "docs")


def test_cli_reports_bad_golden_line_and_unknown_run(tmp_path: Path) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path)}
    bad = write(tmp_path / "bad.jsonl", [json.dumps(ITEMS[0]), "[1, 2]"])
    result = CliRunner().invoke(main, ["eval", "golden", str(bad), "-c", "docs"], env=env)
    assert result.exit_code == 1 and "line 2: not a JSON object" in result.output
    result = CliRunner().invoke(main, ["eval", "compare", "abc", "def"], env=env)
    assert result.exit_code == 1 and "no golden run with id 'abc'" in result.output


def test_metrics() -> None:
    assert exact_match("The answer, is 42!", "answer is 42")
    assert not exact_match("answer is 41", "answer is 42")
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(
        2 * 1.0 * (2 / 3) / (1 + 2 / 3)
    )
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert retrieval_recall(["a.md", "b.md"], ["/x/a.md", "/x/c.md"]) == 0.5
    assert retrieval_recall([], ["/x/a.md"]) is None
    assert sentences('According to [1], "x" is y. Then z!\nDone') == [
        'According to , "x" is y.', "Then z!", "Done",
    ]  # fmt: skip


def test_faithfulness_with_the_embedding_model(live: Live) -> None:
    embedder = live.resources.retrieval.embedder
    passage = "The assert statement raises AssertionError when its condition is false."
    supported = "The assert statement raises AssertionError when the condition is false."
    unrelated = "Bananas grow in tropical climates and are rich in potassium."
    assert faithfulness(supported, [passage], embedder, 0.5) == 1.0
    assert faithfulness(unrelated, [passage], embedder, 0.5) == 0.0
    assert faithfulness(f"{supported} {unrelated}", [passage], embedder, 0.5) == 0.5
    assert faithfulness(supported, [], embedder, 0.5) == 0.0
    assert faithfulness("", [passage], embedder, 0.5) is None


def test_cli_golden_then_compare(live: Live, tmp_path: Path) -> None:
    s = live.settings
    env = {
        "SPECRAG_DATA_DIR": str(s.data_dir),
        "SPECRAG_TARGET_MODEL": str(s.target_model),
        "SPECRAG_DRAFT_MODEL": str(s.draft_model),
        "SPECRAG_DEVICE": "cpu",
        "SPECRAG_DEFAULT_MAX_TOKENS": "8",
    }
    golden = write(tmp_path / "g.jsonl", [json.dumps(i) for i in ITEMS[:2]])
    runner = CliRunner()
    args = ["eval", "golden", str(golden), "-c", "docs", "--tenant", "acme", "--json"]
    first = runner.invoke(main, args, env=env)
    assert first.exit_code == 0, first.output
    run_a = json.loads(first.output.strip().splitlines()[-1])
    assert run_a["items"] == 2 and run_a["identical_rate"] == 1.0
    second = runner.invoke(main, [*args[:-1], "--method", "ngram", "--json"], env=env)
    run_b = json.loads(second.output.strip().splitlines()[-1])
    result = runner.invoke(main, ["eval", "compare", run_a["run_id"], run_b["run_id"]], env=env)
    assert result.exit_code == 0, result.output
    assert "identical_rate" in result.output and "2 common items" in result.output
    refused = runner.invoke(main, [*args[:-1], "--method", "none"], env=env)
    assert refused.exit_code == 1 and "method: must be a speculation method" in refused.output
