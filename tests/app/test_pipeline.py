"""The pipeline on the embedded SQLite database with real retrieval and the tiny model pair."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.db import Answer, GenerationStatsRecord, Query, prepare
from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
from app.pipeline import _record, answer_query, claim
from app.resources import Resources
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def resources(tmp_path_factory: Any, tiny_models: dict[str, Path]) -> Resources:
    """Resources on a fresh SQLite database with two demo files ingested for tenant acme."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("pipeline"),
        target_model=tiny_models["target"],
        draft_model=tiny_models["draft"],
        device="cpu",
    )
    _, factory = prepare(settings)
    res = Resources(settings, factory)
    corpus = ROOT / "demo" / "corpus"
    report = res.retrieval.ingest(
        [corpus / "assert.md", corpus / "pass.md"], collection="docs", tenant="acme"
    )
    assert report.ok
    return res


def _submit(res: Resources, collection: str = "docs", **params: Any) -> uuid.UUID:
    req = validate_request(
        res.settings, {"question": "What does assert do?", "collection": collection, **params}
    )
    with res.session_factory() as session:
        return create_query(session, get_or_create_tenant(session, "acme"), req)[0].id


def _count(factory: sessionmaker[Session], model: Any, qid: uuid.UUID) -> int:
    with factory() as session:
        return int(
            session.scalar(select(func.count()).select_from(model).where(model.query_id == qid))
            or 0
        )


def test_answer_is_recorded_once_with_sources_stats_and_timings(resources: Resources) -> None:
    qid = _submit(resources, max_tokens=5, num_speculative_tokens=3)
    assert answer_query(resources, qid, host="test-host") == "succeeded"
    assert answer_query(resources, qid, host="other") == "skipped"  # a second delivery
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and query.answer is not None and query.stats is not None
        assert (query.status, query.attempts, query.worker_host) == ("succeeded", 1, "test-host")
        assert [s.rank for s in query.answer.sources] == list(
            range(1, len(query.answer.sources) + 1)
        )
        assert query.answer.sources and query.answer.sources[0].document.endswith("assert.md")
        top = query.answer.sources[0].to_dict()  # why it was cited: both legs' ranks, stored
        assert isinstance(top["dense_rank"], int) and isinstance(top["lexical_rank"], int)
        assert query.answer.index_version is not None and query.answer.model_pair
        stats = query.stats.to_dict()
        assert stats["num_speculative_tokens"] == 3 and stats["method"] == "draft_model"
        assert 1 <= stats["num_output_tokens"] <= 5
        assert stats["total_ms"] >= stats["retrieval_ms"] + stats["generation_ms"]
        assert len(stats["accepted_per_position"]) == 3
        assert stats["num_cached_prompt_tokens"] == 0  # stored, and nothing was reused
        assert query.started_at <= query.retrieved_at <= query.done_at  # type: ignore[operator]
    assert _count(resources.session_factory, Answer, qid) == 1


LATE_STATS = {
    "method": "none",
    "num_speculative_tokens": None,
    "num_output_tokens": 1,
    "num_target_forwards": 1,
    "num_drafts": 0,
    "num_draft_tokens": 0,
    "num_accepted_tokens": 0,
}


def test_a_late_second_run_cannot_record_a_second_answer(resources: Resources) -> None:
    qid = _submit(resources, max_tokens=2)
    assert answer_query(resources, qid) == "succeeded"
    stats = LATE_STATS
    outcome = _record(
        resources.session_factory,
        resources.settings,
        qid,
        attempt=1,
        question=None,
        text="late",
        cited=[],
        stats=stats,
        model_pair="x",
        engine_kind="torch",
        index_version=None,
        prompt_tokens=1,
        times={},
    )
    assert outcome == "superseded"  # the attempt no longer holds the (answered) query
    assert _count(resources.session_factory, Answer, qid) == 1
    assert _count(resources.session_factory, GenerationStatsRecord, qid) == 1


def test_a_stale_attempt_records_nothing_once_a_newer_one_holds_the_query(
    resources: Resources,
) -> None:
    from app.lifecycle.lease import claim, release

    qid = _submit(resources, max_tokens=2)
    sf = resources.session_factory
    first = claim(sf, qid, "stalled")
    assert first is not None and first.attempt == 1
    assert release(sf, qid)  # what the reaper does to a stalled worker's query
    second = claim(sf, qid, "second")
    assert second is not None and second.attempt == 2

    def record_as(attempt: int) -> str:
        return _record(
            sf, resources.settings, qid, attempt=attempt, question=None, text=f"by {attempt}",
            cited=[], stats=LATE_STATS, model_pair="x",
            engine_kind="torch", index_version=None, prompt_tokens=1, times={},
        )  # fmt: skip

    assert record_as(1) == "superseded"  # the resumed stale attempt: nothing kept
    assert _count(sf, Answer, qid) == 0 and _count(sf, GenerationStatsRecord, qid) == 0
    assert not release(sf, qid, attempt=1)  # nor can it hand back what it no longer holds
    assert record_as(2) == "succeeded"
    with sf() as session:
        query = session.get(Query, qid)
        assert query is not None and query.answer is not None
        assert (query.status, query.answer.text) == ("succeeded", "by 2")


def test_unknown_collection_fails_the_query_with_a_stable_error(
    resources: Resources, caplog: pytest.LogCaptureFixture
) -> None:
    from app.lifecycle.failures import COLLECTION_GONE

    qid = _submit(resources, collection="nope")
    with caplog.at_level("WARNING", "app.pipeline"):
        assert answer_query(resources, qid) == "failed"
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        # The client reads a documented message; the exception's details go to the log only.
        assert query is not None and query.status == "failed" and query.error == COLLECTION_GONE
    assert any("nope" in r.getMessage() for r in caplog.records)
    assert answer_query(resources, uuid.uuid4()) == "missing"


def test_claim_is_atomic(resources: Resources) -> None:
    qid = _submit(resources)
    first = claim(resources.session_factory, qid, "a")
    assert first is not None and first.attempt == 1 and first.question == "What does assert do?"
    assert claim(resources.session_factory, qid, "b") is None


def test_an_answer_worker_start_warms_the_indexes_on_sqlite(resources: Resources) -> None:
    """Resources.warm(answer=True) opens retrieval with the recent indexes already held (the
    embedded SQLite database, a fresh data directory: nothing from the first host's files)."""
    settings = resources.settings.model_copy(
        update={"data_dir": resources.settings.data_dir / "second-host"}
    )
    fresh = Resources(settings, resources.session_factory)
    fresh._engine = resources.engine  # the pair is loaded once per module
    fresh.warm(answer=True, ingest=False)
    held = fresh.retrieval.indexes
    assert held.held_version("acme", "docs") == resources.retrieval.index_version(
        collection="docs", tenant="acme"
    )
    assert held.sources["build"] == 1
    fresh.close()


def test_cached_prompt_kv_is_shared_within_a_tenant_only(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """Two tenants with the same documents ask the same question: the second tenant's prompt is
    computed afresh (a cache hit would tell it the first one asked); the same tenant asking again
    reuses its own prompt's KV."""
    settings = Settings(
        data_dir=tmp_path,
        target_model=tiny_models["target"],
        draft_model=tiny_models["draft"],
        device="cpu",
        prefix_cache_mb=4,
    )
    _, factory = prepare(settings)
    res = Resources(settings, factory)
    corpus = ROOT / "demo" / "corpus"
    for tenant in ("acme", "globex"):
        assert res.retrieval.ingest([corpus / "assert.md"], collection="docs", tenant=tenant).ok

    def ask(tenant: str) -> int:
        req = validate_request(
            settings, {"question": "What does assert do?", "collection": "docs", "max_tokens": 3}
        )
        with factory() as session:
            qid = create_query(session, get_or_create_tenant(session, tenant), req)[0].id
        assert answer_query(res, qid, host="test-host") == "succeeded"
        with factory() as session:
            query = session.get(Query, qid)
            assert query is not None and query.stats is not None
            return int(query.stats.to_dict()["num_cached_prompt_tokens"])

    assert ask("acme") == 0
    assert ask("globex") == 0  # same prompt tokens, another tenant
    assert ask("acme") > 0  # its own earlier prompt


@pytest.mark.parametrize("mode", ["dense", "lexical"])
def test_the_pipeline_searches_in_the_configured_mode(resources: Resources, mode: str) -> None:
    """SPECRAG_SEARCH_MODE: the worker's retrieval runs that leg alone (stored ranks show it)."""
    settings = resources.settings.model_copy(update={"search_mode": mode})
    other = Resources(settings, resources.session_factory)  # a worker of this host so set
    other._engine = resources.engine  # the pair is loaded once per module
    qid = _submit(other, max_tokens=2)
    assert answer_query(other, qid) == "succeeded"
    with other.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and query.answer is not None
        sources = [s.to_dict() for s in query.answer.sources]
    assert sources and sources[0]["document"].endswith("assert.md")
    used, unused = ("dense_rank", "lexical_rank") if mode == "dense" else ("lexical_rank",
                                                                           "dense_rank")  # fmt: skip
    assert all(isinstance(s[used], int) and s[unused] is None for s in sources), sources
    other.close()
