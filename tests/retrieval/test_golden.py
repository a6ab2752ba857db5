"""The demo golden set: recall@5 >= 0.9 on the whole demo corpus, through ``specrag``.

The one test that ingests all of demo/corpus (about 780 chunks, 1-3 minutes of MiniLM on a
shared CPU); every other test uses a few small files.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from app.cli import main
from retrieval import Embedder

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_retrieval.jsonl"


def test_golden_set_is_well_formed() -> None:
    lines = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    assert len(lines) >= 50
    sources = {p.name for p in (ROOT / "demo" / "corpus").glob("*.md")}
    assert all(item["expected_source"] in sources for item in lines)
    assert len({item["question"] for item in lines}) == len(lines)


def test_golden_recall_at_5(tmp_path: Path, embedder: Embedder) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path / "var"), "SPECRAG_DATABASE_URL": None}
    runner = CliRunner()
    ingest = runner.invoke(main, ["ingest", str(ROOT / "demo" / "corpus"), "-c", "demo", "--json"],
                           env=env, catch_exceptions=False)  # fmt: skip
    assert ingest.exit_code == 0, ingest.stdout + ingest.stderr
    assert json.loads(ingest.stdout)["added"] == 79
    result = runner.invoke(
        main, ["eval", "retrieval", str(GOLDEN), "-c", "demo", "--top-k", "5", "--json"], env=env
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    print(f"golden set: n={data['n']} recall@5={data['recall_at_k']:.3f} mrr={data['mrr']:.3f}")
    assert data["n"] >= 50 and data["k"] == 5
    assert data["recall_at_k"] >= 0.9, data["misses"]
    assert data["mrr"] >= 0.7
