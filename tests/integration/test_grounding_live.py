"""Grounding through the live service (PostgreSQL, Redis, a live worker, the API): every answer
carries it in ``GET /v1/queries/{id}``, the client's wait and the stream's ``done`` event."""

from __future__ import annotations

from typing import Any

import pytest

from app.client import SpecragClient

pytestmark = pytest.mark.integration


def test_done_and_get_carry_the_answers_grounding(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str
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
