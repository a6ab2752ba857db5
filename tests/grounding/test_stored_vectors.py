"""The fused scorer's passage vectors stored with the chunks, on PostgreSQL and real MiniLM:
written at ingest, read for an answer (which then encodes only its claims), written through for
a chunk without them, refused when they no longer fit, and backfilled."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, update

from app.db import Answer, AnswerSource, prepare
from app.grounding import ground_stored
from app.grounding.store import passage_vectors
from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
from app.resources import Resources
from app.settings import Settings
from retrieval.grounding import FusedScorer, ground
from retrieval.grounding.passages import LAYOUT, PassageVectors, encode_passages, passage_view
from retrieval.grounding.stored import backfill, stored_vectors
from retrieval.records import Chunk, Document

ROOT = Path(__file__).resolve().parents[2]
ANSWER = (
    "The assert statement inserts debugging assertions into a program [1]. "
    "It emits no code when optimization is requested [1]. The pass statement does nothing [2]."
)


class CountingEncoder:
    """The real embedder, counting the texts it is asked to encode."""

    def __init__(self, encoder: Any) -> None:
        self.encoder, self.texts = encoder, 0
        self.dim = encoder.dim  # as the scorer reads it of the worker's embedder

    def encode(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return np.asarray(self.encoder.encode(texts))


@pytest.fixture(scope="module")
def res(migrated_pg_url: str, tmp_path_factory: Any) -> Resources:
    settings = Settings(data_dir=tmp_path_factory.mktemp("stored"), database_url=migrated_pg_url,
                        device="cpu", grounding=True)  # fmt: skip
    return Resources(settings, prepare(settings)[1])


@pytest.fixture(scope="module")
def tenant(res: Resources) -> str:
    """A tenant whose collection ``docs`` is ingested with grounding on (vectors stored)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    corpus = ROOT / "demo" / "corpus"
    report = res.retrieval.ingest([corpus / "assert.md", corpus / "pass.md"], collection="docs",
                                  tenant=name)  # fmt: skip
    assert report.ok, report.to_dict()
    return name


def _chunks(res: Resources, tenant: str) -> list[Any]:
    with res.session_factory() as session:
        return list(
            session.execute(
                select(Chunk.id, Chunk.text, Chunk.grounding_vectors, Chunk.grounding_layout)
                .join(Document)
                .where(Document.tenant == tenant)
                .order_by(Chunk.id)
            ).all()
        )


def _answer(res: Resources, tenant: str, chunks: list[Any]) -> uuid.UUID:
    """A stored answer citing ``chunks`` (as the pipeline copies them into its sources)."""
    req = validate_request(res.settings, {"question": "What does assert do?", "collection": "docs"})
    with res.session_factory() as session:
        qid = create_query(session, get_or_create_tenant(session, tenant), req)[0].id
        sources = [AnswerSource(rank=i + 1, document="d.md", chunk_id=c.id, score=1.0, text=c.text)
                   for i, c in enumerate(chunks)]  # fmt: skip
        session.add(Answer(query_id=qid, text=ANSWER, model_pair="p", engine="torch",
                           index_version=1, sources=sources))  # fmt: skip
        session.commit()
    return qid


def test_stored_vectors_round_trip_and_refuse_another_split() -> None:
    view = passage_view("One sentence here. Another one there.")
    vectors = PassageVectors(np.ones(4, np.float32), np.full((2, 4), 0.5, np.float32))
    back = PassageVectors.from_stored(vectors.to_bytes(), view)
    assert back is not None and back.vector.tolist() == [1.0] * 4 and back.singles.shape == (2, 4)
    # Vectors of a passage that split into one sentence do not fit one that splits into two.
    one = PassageVectors(np.ones(4, np.float32), np.ones((1, 4), np.float32))
    assert PassageVectors.from_stored(one.to_bytes(), view) is None
    assert PassageVectors.from_stored(b"", view) is None


def test_ingest_stores_every_chunks_vectors(res: Resources, tenant: str) -> None:
    chunks = _chunks(res, tenant)
    assert chunks and all(c.grounding_layout == LAYOUT for c in chunks)
    first = chunks[0]
    stored = PassageVectors.from_stored(first.grounding_vectors, passage_view(first.text))
    assert stored is not None
    fresh = encode_passages(res.retrieval.embedder, [first.text])[0]
    assert np.allclose(stored.vector, fresh.vector, atol=1e-5)
    assert np.allclose(stored.singles, fresh.singles, atol=1e-5)


def test_an_answer_encodes_only_its_claims_and_scores_as_without(
    res: Resources, tenant: str
) -> None:
    chunks = _chunks(res, tenant)[:3]
    qid = _answer(res, tenant, chunks)
    counting = CountingEncoder(res.retrieval.embedder)
    row = ground_stored(res.session_factory, FusedScorer(counting), qid)
    assert row is not None and row.num_sentences == 3
    assert counting.texts == 3  # the three claims; no passage, no passage sentence
    # The same grounding as a scorer that encodes every passage itself, to float rounding.
    plain = ground(
        ANSWER, [c.text for c in chunks], FusedScorer(res.retrieval.embedder, cache_passages=0)
    )
    for stored, fresh in zip(row.sentences, plain.to_dict()["sentences"], strict=True):
        assert stored["supported_by"] == fresh["supported_by"]
        assert stored["score"] == pytest.approx(fresh["score"], abs=1e-5)
        assert [(s["start"], s["end"]) for s in stored["support"]] == [
            (s["start"], s["end"]) for s in fresh["support"]
        ]


def test_a_chunk_without_vectors_gets_them_from_its_first_answer(
    res: Resources, tenant: str
) -> None:
    chunk = _chunks(res, tenant)[-1]
    with res.session_factory() as session:
        session.execute(update(Chunk).where(Chunk.id == chunk.id)
                        .values(grounding_vectors=None, grounding_layout=None))  # fmt: skip
        session.commit()
    counting = CountingEncoder(res.retrieval.embedder)
    scorer = FusedScorer(counting)
    with res.session_factory() as session:
        known = passage_vectors(session, scorer, [(chunk.id, chunk.text)])
    assert known is not None and chunk.text in known
    assert counting.texts == 1 + passage_view(chunk.text).singles  # encoded once, here
    with res.session_factory() as session:
        assert stored_vectors(session, [(chunk.id, chunk.text)]) == known
        # A source whose text is not its chunk's (re-chunked since) is neither read nor written.
        assert stored_vectors(session, [(chunk.id, chunk.text + " changed")]) == {}


def test_backfill_fills_missing_and_other_layouts_of_the_tenant_named(
    res: Resources, tenant: str
) -> None:
    chunks = _chunks(res, tenant)
    with res.session_factory() as session:
        session.execute(update(Chunk).where(Chunk.id == chunks[0].id)
                        .values(grounding_vectors=None, grounding_layout=None))  # fmt: skip
        session.execute(update(Chunk).where(Chunk.id == chunks[1].id)
                        .values(grounding_layout=LAYOUT + 1))  # fmt: skip
        session.commit()
    assert backfill(res.session_factory, res.retrieval.embedder, tenant="nobody").chunks == 0
    done = backfill(res.session_factory, res.retrieval.embedder, tenant=tenant, collection="docs")
    assert (done.chunks, done.collections) == (2, 1)
    after = _chunks(res, tenant)
    assert all(c.grounding_layout == LAYOUT for c in after)
    view = passage_view(after[0].text)
    assert PassageVectors.from_stored(after[0].grounding_vectors, view) is not None


def test_backfill_command_stores_what_is_missing(
    res: Resources, tenant: str, migrated_pg_url: str, tmp_path: Path
) -> None:
    import json

    from click.testing import CliRunner

    from app.cli import main

    chunk = _chunks(res, tenant)[0]
    with res.session_factory() as session:
        session.execute(update(Chunk).where(Chunk.id == chunk.id)
                        .values(grounding_vectors=None, grounding_layout=None))  # fmt: skip
        session.commit()
    env = {"SPECRAG_DATABASE_URL": migrated_pg_url, "SPECRAG_DATA_DIR": str(tmp_path)}
    args = ["grounding", "backfill", "--tenant", tenant, "--json"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1]) == {"chunks": 1, "collections": 1}
    assert _chunks(res, tenant)[0].grounding_layout == LAYOUT
