"""Grounding in the pipeline on PostgreSQL with real retrieval, MiniLM and the tiny model pair:
stored after the answer, shown in the query's view, and without effect on answers and stats."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.db import Answer, AnswerGrounding, AnswerSource, prepare
from app.grounding import ground_stored, install_hooks, wait_for_grounding
from app.grounding.background import GroundingBacklog
from app.grounding.hooks import ground_answer
from app.hooks import unregister_after_answer
from app.lifecycle.queries import (
    create_query,
    get_or_create_tenant,
    get_query,
    query_json,
    validate_request,
)
from app.pipeline import answer_query
from app.resources import Resources
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"ttft_ms", "generation_ms", "queue_ms", "retrieval_ms", "total_ms", "trace_id"}


@pytest.fixture(scope="module")
def settings(migrated_pg_url: str, tiny_models: dict[str, Path], tmp_path_factory: Any) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("grounding"),
        database_url=migrated_pg_url,
        target_model=tiny_models["target"],
        draft_model=tiny_models["draft"],
        device="cpu",
    )


def _resources(settings: Settings, **changes: Any) -> Resources:
    s = settings.model_copy(update=changes)
    _, factory = prepare(s)
    return Resources(s, factory)


def _submit(res: Resources, tenant: str, **params: Any) -> uuid.UUID:
    req = validate_request(
        res.settings, {"question": "What does assert do?", "collection": "docs", **params}
    )
    with res.session_factory() as session:
        return create_query(session, get_or_create_tenant(session, tenant), req)[0].id


@pytest.fixture(scope="module")
def hooked() -> Any:
    install_hooks()
    yield
    unregister_after_answer(ground_answer)


def test_grounding_on_and_off_give_the_same_answers_and_stats(
    settings: Settings, hooked: Any
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    on, off = _resources(settings, grounding=True), _resources(settings, grounding=False)
    report = on.retrieval.ingest(
        [ROOT / "demo" / "corpus" / "assert.md", ROOT / "demo" / "corpus" / "pass.md"],
        collection="docs",
        tenant=tenant,
    )
    assert report.ok
    views = []
    for res in (on, off):
        qid = _submit(res, tenant, max_tokens=12, num_speculative_tokens=3)
        assert answer_query(res, qid, host="test") == "succeeded"
        with res.session_factory() as session:
            query = get_query(session, qid, None)
            assert query is not None
            views.append(query_json(query))
    with_g, without = views
    assert with_g["answer"] == without["answer"]
    assert {k: v for k, v in with_g["stats"].items() if k not in TIMING} == {
        k: v for k, v in without["stats"].items() if k not in TIMING
    }
    assert "grounding" not in without
    g = with_g["grounding"]
    assert g["scorer"] == "fused-bm25-minilm" and g["grounding_ms"] > 0
    if g["groundedness"] is None:
        assert g["reason"] in ("empty answer", "no sentences")
    else:
        assert 0.0 <= g["groundedness"] <= 1.0
        for s in g["sentences"]:
            assert with_g["answer"][s["start"] : s["end"]] == s["text"]
            assert all(0 <= j < len(with_g["sources"]) for j in s["supported_by"])


def _stored_answer(res: Resources, tenant: str, text: str, passages: list[str]) -> uuid.UUID:
    qid = _submit(res, tenant)
    with res.session_factory() as session:
        session.add(
            Answer(
                query_id=qid, text=text, model_pair="p", engine="torch", index_version=1,
                sources=[
                    AnswerSource(rank=i + 1, document="d.md", chunk_id=i, score=1.0, text=p)
                    for i, p in enumerate(passages)
                ],
            )
        )  # fmt: skip
        session.commit()
    return qid


def test_stored_grounding_is_kept_once_and_null_with_a_reason(settings: Settings) -> None:
    res = _resources(settings)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    passage = "Assert statements insert debugging assertions into a program."
    qid = _stored_answer(
        res, tenant, "Assert statements insert debugging assertions [1].", [passage]
    )
    first = ground_stored(res.session_factory, res.grounding_scorer, qid)
    again = ground_stored(res.session_factory, res.grounding_scorer, qid)
    assert first is not None and again is not None and first.id == again.id
    assert first.groundedness == 1.0 and first.citation_precision == 1.0
    for text, passages, reason in (("", [passage], "empty answer"), ("Yes.", [], "no passages")):
        row = ground_stored(res.session_factory, res.grounding_scorer,
                            _stored_answer(res, tenant, text, passages))  # fmt: skip
        assert row is not None and row.groundedness is None and row.reason == reason
    with res.session_factory() as session:
        assert session.get(AnswerGrounding, first.id) is not None


def test_a_grounding_checkpoint_that_cannot_load_refuses_the_worker(
    settings: Settings, tmp_path: Path
) -> None:
    from retrieval.grounding import ScorerLoadError

    res = _resources(settings, grounding=True, grounding_model=tmp_path / "nowhere")
    with pytest.raises(ScorerLoadError, match="nowhere"):
        res.warm(answer=True, ingest=False)


class _HeldScorer:
    """The real scorer, held at a gate: the test decides when grounding may finish."""

    def __init__(self, scorer: Any) -> None:
        self.scorer, self.name, self.threshold = scorer, scorer.name, scorer.threshold
        self.gate, self.entered = threading.Event(), threading.Event()

    def support(self, claims: Any, passages: Any, known: Any = None) -> Any:
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return self.scorer.support(claims, passages, known)


def test_a_worker_grounds_on_its_own_thread_after_the_task_returned(
    settings: Settings, hooked: Any
) -> None:
    res = _resources(settings, grounding=True)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assert res.retrieval.ingest(
        [ROOT / "demo" / "corpus" / "assert.md"], collection="docs", tenant=tenant
    ).ok
    held = _HeldScorer(res.grounding_scorer)
    res._grounding_scorer = held
    res.grounding_backlog = GroundingBacklog()
    try:
        qid = _submit(res, tenant, max_tokens=12, num_speculative_tokens=3)
        # The task returns while the grounding thread is still held in the scorer.
        assert answer_query(res, qid, host="test") == "succeeded"
        assert held.entered.wait(60)
        with res.session_factory() as session:
            query = get_query(session, qid, None)
            assert query is not None and query.status == "succeeded"
            assert "grounding" not in query_json(query)
        held.gate.set()
        view = query_json(wait_for_grounding(res.session_factory, qid, timeout=60))
        assert view["grounding"]["scorer"] == "fused-bm25-minilm"
    finally:
        held.gate.set()
        res.close()
