"""Grounding through the live service (PostgreSQL, Redis, a live worker, the API): every answer
carries it in ``GET /v1/queries/{id}``, the client's wait and the stream's ``done`` event, and its
sources' chunks hold the scorer's passage vectors, stored by the ingest."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from app.client import SpecragClient
from app.settings import Settings

pytestmark = pytest.mark.integration


def test_done_and_get_carry_the_answers_grounding(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str, service_settings: Settings
) -> None:
    with SpecragClient(api.url, keys["acme"]) as client:
        qid = client.submit("What does the assert statement do?", ingested, max_tokens=8)
        events = list(client.stream(qid, timeout=120))
        view = client.wait(qid, timeout=60, with_grounding=True)
    assert events[-1].event == "done"
    done = events[-1].data
    # The worker grounds before it marks the stream's end: done carries what GET shows.
    assert done == view and "grounding" in view, done
    g = view["grounding"]
    assert g["scorer"] == "fused-bm25-minilm"
    if g["groundedness"] is None:
        assert g["reason"] in ("empty answer", "no sentences")
    else:
        assert 0.0 <= g["groundedness"] <= 1.0
        for s in g["sentences"]:
            assert view["answer"][s["start"] : s["end"]] == s["text"]
            assert all(0 <= j < len(view["sources"]) for j in s["supported_by"])
    _assert_sources_hold_vectors(service_settings, view["sources"])


def _assert_sources_hold_vectors(settings: Settings, sources: list[dict[str, Any]]) -> None:
    """Each source's chunk holds vectors under the current layout that fit its passage."""
    from app.db import prepare
    from retrieval.grounding.passages import LAYOUT, PassageVectors, passage_view
    from retrieval.records import Chunk

    assert sources
    engine, session_factory = prepare(settings)
    try:
        with session_factory() as session:
            rows = session.execute(
                select(Chunk.id, Chunk.text, Chunk.grounding_vectors, Chunk.grounding_layout).where(
                    Chunk.id.in_([s["chunk_id"] for s in sources])
                )
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == len({s["chunk_id"] for s in sources})
    for row in rows:
        assert row.grounding_layout == LAYOUT
        assert PassageVectors.from_stored(row.grounding_vectors, passage_view(row.text)) is not None
