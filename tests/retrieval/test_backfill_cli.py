"""``specrag index backfill`` on the embedded SQLite: vectors from index files first, then embedded."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result

from app.cli import main
from retrieval import Embedder
from tests.retrieval.docs import ENGINES, FRUIT, write


def test_backfill_takes_vectors_from_files_then_embeds_the_rest(
    tmp_path: Path, embedder: Embedder
) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path / "var"), "SPECRAG_DATABASE_URL": None}

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)

    docs = [str(write(tmp_path / "fruit.md", FRUIT)), str(write(tmp_path / "engines.md", ENGINES))]
    assert run("ingest", *docs, "--collection", "kb", "--json").exit_code == 0
    database = tmp_path / "var" / "specrag.db"

    def forget_vectors() -> int:
        with sqlite3.connect(database) as conn:
            return conn.execute("UPDATE chunks SET embedding = NULL").rowcount

    chunks = forget_vectors()
    result = run("index", "backfill", "--json")
    assert result.exit_code == 0, result.stderr
    (got,) = json.loads(result.stdout)["collections"]
    assert (got["collection"], got["from_files"], got["embedded"]) == ("kb", chunks, 0)

    forget_vectors()
    shutil.rmtree(tmp_path / "var" / "indexes")
    result = run("index", "backfill", "--collection", "kb", "--json")
    (got,) = json.loads(result.stdout)["collections"]
    assert (got["from_files"], got["embedded"]) == (0, chunks)
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM chunks WHERE embedding IS NULL").fetchone() == (
            0,
        )
    search = run("search", "centrifugal governor", "-c", "kb", "--json")
    assert json.loads(search.stdout)["results"][0]["document"] == docs[1]
    assert run("index", "backfill", "--collection", "none", "--json").stdout.strip() == (
        '{"collections": []}'
    )
    # Chunks from before migration 0008: their lexical terms are analysed and stored, with progress.
    with sqlite3.connect(database) as conn:
        forgotten = conn.execute("UPDATE chunks SET lexical_terms = NULL").rowcount
    result = run("index", "backfill", "--collection", "kb")
    assert result.exit_code == 0 and f"{forgotten} lexical terms stored" in result.stdout
    assert "terms default/kb" in result.stderr  # the progress bar
    with sqlite3.connect(database) as conn:
        nulls = conn.execute("SELECT count(*) FROM chunks WHERE lexical_terms IS NULL").fetchone()
    assert nulls == (0,)
    lexical = run("search", "centrifugal", "-c", "kb", "--mode", "lexical", "--json")
    assert json.loads(lexical.stdout)["results"][0]["document"] == docs[1]
