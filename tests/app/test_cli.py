"""The service's CLI commands: --json output, one-line errors, nothing stored for bad input."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from app.cli import main
from app.db import ApiKey, Query, prepare
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _env(data: Path, tiny: dict[str, Path] | None = None) -> dict[str, str]:
    env = {"SPECRAG_DATA_DIR": str(data), "SPECRAG_DEVICE": "cpu"}
    if tiny:
        env |= {
            "SPECRAG_TARGET_MODEL": str(tiny["target"]),
            "SPECRAG_DRAFT_MODEL": str(tiny["draft"]),
        }
    return env


def test_db_upgrade_and_keys_create(tmp_path: Path) -> None:
    runner = CliRunner()
    env = _env(tmp_path)
    up = runner.invoke(main, ["db", "upgrade", "--json"], env=env)
    assert up.exit_code == 0, up.output
    current = json.loads(runner.invoke(main, ["db", "current", "--json"], env=env).output)
    assert current["current"] == current["head"] == json.loads(up.output)["revision"]
    made = runner.invoke(main, ["keys", "create", "--tenant", "acme", "--json"], env=env)
    key = json.loads(made.output)["key"]
    _, factory = prepare(Settings(data_dir=tmp_path))
    with factory() as session:
        stored = session.scalars(select(ApiKey)).one()
    assert stored.key_hash != key and key not in stored.key_hash and len(stored.key_hash) == 64


def test_unmigrated_database_is_a_one_line_error(tmp_path: Path) -> None:
    env = _env(tmp_path) | {"SPECRAG_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}"}
    result = CliRunner().invoke(main, ["keys", "create", "--tenant", "acme"], env=env)
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "specrag db upgrade" in result.output


def test_bad_ask_input_names_the_field_and_stores_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    env = _env(tmp_path)
    for args, field in (
        (["--max-tokens", "0"], "max_tokens"),
        (["--method", "beam"], "method"),
        (["--temperature", "9"], "temperature"),
        ([], "collection"),  # not ingested
    ):
        result = runner.invoke(
            main, ["ask", "Why?", "--collection", "nope", "--local", *args], env=env
        )
        assert result.exit_code == 1, result.output
        assert result.output.startswith(f"error: {field}: ") and result.output.count("\n") == 1
    _, factory = prepare(Settings(data_dir=tmp_path))
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Query)) == 0


def test_ask_local_prints_the_contract_json(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    runner = CliRunner()
    env = _env(tmp_path, tiny_models)
    ingest = runner.invoke(
        main,
        ["ingest", str(ROOT / "demo" / "corpus" / "pass.md"), "--collection", "c", "--json"],
        env=env,
    )
    assert ingest.exit_code == 0, ingest.output
    result = runner.invoke(
        main, ["ask", "What is pass?", "-c", "c", "--local", "--max-tokens", "3", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    view = json.loads(result.output.strip().splitlines()[-1])
    assert {"id", "status", "answer", "sources", "stats"} <= set(view)
    assert view["status"] == "succeeded" and view["sources"][0]["document"].endswith("pass.md")
    # A one-shot local answer is a check, not traffic: labelled, left out, shown apart.
    _, factory = prepare(Settings(data_dir=tmp_path))
    with factory() as session:
        assert (
            session.scalar(select(Query.source).where(Query.id == uuid.UUID(view["id"]))) == "local"
        )
    report = runner.invoke(main, ["audit", "report"], env=env)
    data = json.loads(report.output)
    assert data["requests"] == 0 and data["headline"]["speculative"]["total_ms"]["n"] == 0
    assert [(n["source"], n["requests"]) for n in data["non_traffic"]] == [("local", 1)]

    assert view["stats"]["prompt_format"] == "raw"  # the tiny pair's tokenizer has no template


def test_ask_local_keeps_its_step_costs_and_applies_torch_threads(
    tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import generation.torch_engine as torch_engine

    timed: list[int] = []
    real = torch_engine.time_batch_steps

    def spy(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("repeats", 2):  # repeats 0 makes passes ready and times nothing
            timed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_engine, "time_batch_steps", spy)
    runner = CliRunner()
    env = _env(tmp_path, tiny_models) | {"SPECRAG_TORCH_THREADS": "1"}
    doc = str(ROOT / "demo" / "corpus" / "pass.md")
    assert runner.invoke(main, ["ingest", doc, "--collection", "c"], env=env).exit_code == 0
    ask = ["ask", "What is pass?", "-c", "c", "--local", "--max-tokens", "3", "--json"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fixed = runner.invoke(main, [*ask, "--num-speculative-tokens", "4"], env=env)
        assert fixed.exit_code == 0, fixed.output
        assert torch.get_num_threads() == 1  # SPECRAG_TORCH_THREADS, as a worker applies it
        assert timed == []  # a fixed k prices no step
        # The warm-up ran this very prompt under a salt of its own: the answer reuses no KV.
        stats = json.loads(fixed.output.strip().splitlines()[-1])["stats"]
        assert stats["num_cached_prompt_tokens"] == 0
        for expected in (1, 1):  # the first process measures its table, the second loads it
            auto = runner.invoke(main, [*ask, "--num-speculative-tokens", "auto"], env=env)
            assert auto.exit_code == 0, auto.output
            assert len(timed) == expected
    finally:
        torch.set_num_threads(threads)
    [stored] = (tmp_path / "step_costs").glob("*.json")
    assert list(json.loads(stored.read_text())["tables"]) == ["1:True"]


def test_ask_local_answers_when_its_warm_up_cannot_build_the_prompt(
    tmp_path: Path,
    tiny_models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import app.commands.ask as ask_command

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("index unreadable")

    monkeypatch.setattr(ask_command, "retrieve", broken)  # the warm-up's, not the answer's
    runner = CliRunner()
    env = _env(tmp_path, tiny_models)
    doc = str(ROOT / "demo" / "corpus" / "pass.md")
    assert runner.invoke(main, ["ingest", doc, "--collection", "c"], env=env).exit_code == 0
    with caplog.at_level("INFO", logger="app.commands.ask"):
        result = runner.invoke(
            main, ["ask", "What is pass?", "-c", "c", "--local", "--max-tokens", "3"], env=env
        )
    assert result.exit_code == 0, result.output
    assert "no prompt to warm (index unreadable)" in caplog.text


def test_collections_system_prompt_is_shown_set_checked_and_cleared(tmp_path: Path) -> None:
    from retrieval.records import CollectionIndex

    runner = CliRunner()
    env = _env(tmp_path)
    engine, factory = prepare(Settings(data_dir=tmp_path))
    with factory() as session:  # collection "c" of tenant "default", as an ingest leaves it
        session.add(CollectionIndex(tenant="default", collection="c", version=1, kind="flat",
                                    num_vectors=1, dim=4))  # fmt: skip
        session.commit()
    engine.dispose()

    def prompt(*extra: str) -> tuple[int, str]:
        result = runner.invoke(
            main, ["collections", "system-prompt", "c", *extra, "--json"], env=env
        )
        return result.exit_code, result.output.strip()

    code, out = prompt()
    assert code == 0 and json.loads(out)["source"] == "settings"
    code, out = prompt("--set", "Answer in one sentence.")
    assert code == 0
    assert json.loads(out) == {
        "collection": "c",
        "system_prompt": "Answer in one sentence.",
        "source": "collection",
    }
    code, out = prompt("--set", "x" * 4001)
    assert code != 0 and "over the limit of 4000" in out and len(out.splitlines()) == 1
    assert json.loads(prompt()[1])["system_prompt"] == "Answer in one sentence."  # unchanged
    code, out = prompt("--clear")
    assert code == 0 and json.loads(out)["source"] == "settings"
    missing = runner.invoke(main, ["collections", "system-prompt", "nope"], env=env)
    assert missing.exit_code != 0 and "no collection 'nope'" in missing.output
