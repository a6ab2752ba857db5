"""``specrag worker`` refuses bad settings at start, before it touches the queue or a model."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from workers.cli import main


def test_an_invalid_search_mode_is_refused_at_start_naming_the_setting(tmp_path: Path) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path), "SPECRAG_SEARCH_MODE": "bm25"}
    result = CliRunner().invoke(main, ["worker"], env=env)
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert line.count("\n") == 0, line
    assert "SPECRAG_SEARCH_MODE" in line and "'bm25'" in line, line
    assert "'hybrid', 'dense' or 'lexical'" in line, line
    assert not (tmp_path / "specrag.db").exists()  # refused before the database was opened


def test_a_negative_all_terms_bonus_is_refused_at_start_naming_the_setting(
    tmp_path: Path,
) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path), "SPECRAG_ALL_TERMS_BONUS": "-1"}
    result = CliRunner().invoke(main, ["worker"], env=env)
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert line.count("\n") == 0 and "SPECRAG_ALL_TERMS_BONUS" in line, line
    assert "greater than or equal to 0" in line, line
    assert not (tmp_path / "specrag.db").exists()
