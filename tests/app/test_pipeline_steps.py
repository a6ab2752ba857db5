"""The pipeline's steps on a fake engine, tokenizer and retrieval, with a real SQLite database.

Fast: no model, no MiniLM, no broker. tests/app/test_pipeline.py runs the same path on the tiny
real model pair.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db import Answer, GenerationStatsRecord, Query
from app.hooks import Answered, register_after_answer, unregister_after_answer
from app.lifecycle import failures
from app.lifecycle.queries import create_query, get_or_create_tenant
from app.pipeline import BuiltRequest, answer_query, loop_step
from app.requests import validate_request
from app.settings import Settings
from tests.fakes import FakeResources, memory_session_factory


@pytest.fixture
def resources(tmp_path: Path) -> FakeResources:
    return FakeResources(Settings(data_dir=tmp_path), memory_session_factory())


@pytest.fixture
def answered() -> Any:
    seen: list[Answered] = []

    def hook(resources: Any, answer: Answered) -> None:
        seen.append(answer)

    register_after_answer(hook)
    yield seen
    unregister_after_answer(hook)


def _submit(resources: FakeResources, **fields: Any) -> uuid.UUID:
    body = {"question": "How often do keys rotate?", "collection": "docs", **fields}
    request = validate_request(resources.settings, body)
    with resources.session_factory() as session:
        query, _ = create_query(session, get_or_create_tenant(session, "acme"), request)
        return query.id


def test_an_answer_is_recorded_with_its_sources_and_stats_then_hooks_run(
    resources: FakeResources, answered: list[Answered]
) -> None:
    qid = _submit(resources, max_tokens=3, method="ngram")
    assert answer_query(resources, qid, host="h") == "succeeded"  # type: ignore[arg-type]
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        answer = session.scalar(select(Answer).where(Answer.query_id == qid))
        stats = session.scalar(
            select(GenerationStatsRecord).where(GenerationStatsRecord.query_id == qid)
        )
        assert query is not None and query.status == "succeeded" and query.worker_host == "h"
        assert answer is not None and [s.document for s in answer.sources] == ["doc0.md"]
        assert answer.model_pair == "fake-target+fake-draft" and answer.index_version == 1
        assert stats is not None and stats.method == "ngram" and stats.num_output_tokens == 3
        assert stats.retrieval_ms is not None and stats.total_ms is not None
    prompt, params = resources.engine.calls[0]
    assert (params.max_new_tokens, params.method) == (3, "ngram")
    assert resources.tokenizer.decode(prompt).count("Keys rotate every ninety days.") == 1
    [hooked] = answered
    assert (hooked.query_id, hooked.status, hooked.tenant, hooked.queue) == (
        qid,
        "succeeded",
        "acme",
        "answer",
    )
    assert hooked.prompt_token_ids == prompt and len(hooked.output_token_ids) == 3
    assert hooked.stats is not None and hooked.stats["total_ms"] is not None


def test_a_failure_is_final_readable_and_reported_to_the_hooks(
    resources: FakeResources, answered: list[Answered]
) -> None:
    qid = _submit(resources, collection="missing")
    assert answer_query(resources, qid) == "failed"  # type: ignore[arg-type]
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and query.status == "failed"
        assert query.error == failures.COLLECTION_GONE  # stable text; the exception goes to the log
    assert [(a.query_id, a.status, a.stats) for a in answered] == [(qid, "failed", None)]
    assert answer_query(resources, qid) == "skipped"  # type: ignore[arg-type]


def test_an_interrupt_puts_the_query_back_on_the_outbox(resources: FakeResources) -> None:
    qid = _submit(resources)
    resources.engine.fail_with = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        answer_query(resources, qid)  # type: ignore[arg-type]
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and (query.status, query.enqueued_at) == ("queued", None)


def test_a_failure_of_a_dead_engine_hands_the_query_back(resources: FakeResources) -> None:
    qid = _submit(resources)
    resources.engine.fail_with = RuntimeError("EngineDeadError: EngineCore encountered an issue")
    resources.dead = True  # the query did nothing wrong: queued again, not failed
    assert answer_query(resources, qid) == "released"  # type: ignore[arg-type]
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and (query.status, query.enqueued_at, query.error) == (
            "queued", None, None
        )  # fmt: skip


def test_the_generate_step_can_be_swapped_and_streams_deltas(resources: FakeResources) -> None:
    qid = _submit(resources, max_tokens=4)
    deltas: list[list[int]] = []
    asked: list[BuiltRequest] = []

    def step(built: BuiltRequest, on_delta: Any) -> Any:
        asked.append(built)
        result = resources.engine.generate(built.prompt_ids, built.sampling)
        for token in result.token_ids:  # an engine loop hands out verified tokens as they land
            on_delta([token])
        return result

    outcome = answer_query(resources, qid, on_delta=deltas.append, generate_step=step)  # type: ignore[arg-type]
    assert outcome == "succeeded"
    assert [d[0] for d in deltas] == resources.engine.calls[0][0][:4]
    assert [hit.document for hit in asked[0].cited] == ["doc0.md"]


def test_the_loop_step_runs_on_the_engine_loop_and_streams_its_deltas(
    resources: FakeResources,
) -> None:
    qid = _submit(resources, max_tokens=3)
    resources.loop = resources.engine.start_loop()  # type: ignore[attr-defined]
    handles: list[Any] = []
    deltas: list[list[int]] = []
    step = loop_step(resources, on_submit=handles.append)  # type: ignore[arg-type]
    outcome = answer_query(resources, qid, on_delta=deltas.append, generate_step=step)  # type: ignore[arg-type]
    assert outcome == "succeeded" and len(handles) == 1 and handles[0].done
    assert deltas == [[t] for t in resources.engine.calls[0][0][:3]]
    with resources.session_factory() as session:
        stats = session.scalar(
            select(GenerationStatsRecord).where(GenerationStatsRecord.query_id == qid)
        )
        assert stats is not None and stats.num_output_tokens == 3


def test_the_default_generate_step_hands_its_tokens_to_on_delta_at_once(
    resources: FakeResources,
) -> None:
    qid = _submit(resources, max_tokens=2)
    deltas: list[list[int]] = []
    assert answer_query(resources, qid, on_delta=deltas.append) == "succeeded"  # type: ignore[arg-type]
    assert deltas == [resources.engine.calls[0][0][:2]]


def test_a_context_too_small_for_max_tokens_fails_the_query(resources: FakeResources) -> None:
    resources.engine.max_context = 20
    qid = _submit(resources, max_tokens=10)
    assert answer_query(resources, qid) == "failed"  # type: ignore[arg-type]
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and query.error == failures.BAD_REQUEST
