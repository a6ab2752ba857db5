"""``specrag ingest | search | delete | eval retrieval``: JSON shapes, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from retrieval import Embedder
from tests.retrieval.docs import ENGINES, FRUIT, write


@pytest.fixture
def run(tmp_path: Path, embedder: Embedder) -> object:
    env = {"SPECRAG_DATA_DIR": str(tmp_path / "var"), "SPECRAG_DATABASE_URL": None}

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)

    return invoke


def test_ingest_search_delete_json(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fruit = write(tmp_path / "kb" / "fruit.md", FRUIT)
    engines = write(tmp_path / "kb" / "engines.md", ENGINES)
    result = run("ingest", str(fruit), str(engines), "--collection", "kb", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)  # stdout is JSON only; the progress bar is on stderr
    assert summary["added"] == 2 and summary["failed"] == 0 and summary["index_version"] == 1
    assert {f["source"] for f in summary["files"]} == {str(fruit), str(engines)}
    assert "ingest kb" in result.stderr

    result = run("search", "How do governors control engine speed?", "-c", "kb", "--top-k", "2",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert len(results) == 2
    assert {"document", "chunk_id", "score", "text"} <= set(results[0])
    assert results[0]["document"] == str(engines) and "governor" in results[0]["text"]
    assert isinstance(results[0]["score"], float) and results[0]["score"] >= results[1]["score"]

    result = run("delete", str(engines), "--collection", "kb", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["deleted"] is True
    result = run("delete", str(engines), "--collection", "kb")
    assert result.exit_code == 1 and result.stderr.startswith("error: no document")


def test_ingest_reports_bad_files_and_exits_1(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = write(tmp_path / "fruit.md", FRUIT)
    bad = tmp_path / "latin.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    result = run("ingest", str(good), str(bad), "--collection", "kb", "--json")
    assert result.exit_code == 1
    files = {f["source"]: f for f in json.loads(result.stdout)["files"]}
    assert files[str(good)]["status"] == "added"
    assert files[str(bad)]["status"] == "failed" and "not valid UTF-8" in files[str(bad)]["error"]
    text = run("ingest", str(good), str(bad), "--collection", "kb")
    assert (
        "unchanged" in text.stdout and "failed" in text.stdout and "not valid UTF-8" in text.stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "", "-c", "kb"], "error: question is empty"),
        (["search", "apples", "-c", "nope"], "error: collection 'nope' does not exist for tenant"),
        (["search", "apples", "-c", "kb", "--top-k", "0"], "error: top_k must be between"),
        (
            ["search", "apples", "-c", "kb", "--tenant", "other"],
            "does not exist for tenant 'other'",
        ),
    ],
)
def test_search_errors_are_one_line(run, tmp_path: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    assert run("ingest", str(write(tmp_path / "f.md", FRUIT)), "-c", "kb").exit_code == 0
    result = run(*args)
    assert result.exit_code == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_eval_reports_malformed_lines(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    golden = tmp_path / "g.jsonl"
    golden.write_text(
        '{"question": "q", "expected_source": "a.md"}\n\n{not json}\n{"question": "q"}\n'
    )
    result = run("eval", "retrieval", str(golden), "--collection", "kb")
    assert result.exit_code == 1
    assert "2 malformed line(s): line 3: not JSON" in result.stderr
    assert "line 4: needs non-empty string fields question, expected_source" in result.stderr


def test_eval_scores_recall_and_mrr(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    kb = tmp_path / "kb"
    write(kb / "fruit.md", FRUIT)
    write(kb / "engines.md", ENGINES)
    assert run("ingest", str(kb), "-c", "kb").exit_code == 0
    golden = tmp_path / "g.jsonl"
    lines = [
        {"question": "When do I prune apple trees?", "expected_source": "fruit.md"},
        {"question": "What raises steam in a fire-tube boiler?", "expected_source": "engines.md"},
        {"question": "Anything at all", "expected_source": "absent.md"},
    ]
    golden.write_text("\n".join(json.dumps(line) for line in lines))
    result = run("eval", "retrieval", str(golden), "-c", "kb", "--top-k", "1", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["n"], data["k"]) == (3, 1)
    assert data["recall_at_k"] == pytest.approx(2 / 3) and data["mrr"] == pytest.approx(2 / 3)
    assert [m["expected_source"] for m in data["misses"]] == ["absent.md"]


def test_search_and_eval_take_a_mode_and_show_both_legs_ranks(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    kb = tmp_path / "kb"
    write(kb / "fruit.md", FRUIT)
    write(kb / "engines.md", ENGINES + "\nThe valve is set with reset_governor_stops().\n")
    assert run("ingest", str(kb), "-c", "kb").exit_code == 0
    shown = {}
    for mode in ("hybrid", "dense", "lexical"):
        result = run("search", "reset_governor_stops", "-c", "kb", "--mode", mode, "--json")
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["mode"] == mode and data["results"]
        shown[mode] = data["results"][0]
        assert {"dense_rank", "lexical_rank", "dense_score", "lexical_score"} <= set(shown[mode])
    assert shown["lexical"]["document"].endswith("engines.md")
    assert shown["lexical"]["lexical_rank"] == 1 and shown["lexical"]["dense_rank"] is None
    assert shown["dense"]["lexical_rank"] is None and shown["dense"]["dense_rank"] == 1
    assert shown["hybrid"]["lexical_rank"] == 1 and shown["hybrid"]["dense_rank"] is not None
    text = run("search", "reset_governor_stops", "-c", "kb")
    assert "dense #" in text.stdout and "lexical #1" in text.stdout

    golden = tmp_path / "g.jsonl"
    golden.write_text(
        json.dumps({"question": "reset_governor_stops", "expected_source": "engines.md"})
    )
    result = run("eval", "retrieval", str(golden), "-c", "kb", "--mode", "lexical", "--json")
    data = json.loads(result.stdout)
    assert (data["mode"], data["recall_at_k"]) == ("lexical", 1.0)
    result = run("search", "x", "-c", "kb", "--mode", "fuzzy")
    assert (
        result.exit_code == 2
        and "'fuzzy' is not one of 'hybrid', 'dense', 'lexical'" in result.stderr
    )
