"""Method ``suffix`` through live workers (real Redis, PostgreSQL, the tiny pair): drafts come
from the asking tenant's own past answers only, and every worker hears what another recorded.

Drafting is deterministic given the prompt and the trees, so two tenants with the same
collection asking the same question get the same drafts exactly when their trees hold the same
answers: a tenant with history elsewhere (B) must draft as a tenant with none (C), while the
tenant that holds the answer (A) drafts it and gets more accepted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db import GenerationStatsRecord, make_engine, make_session_factory
from app.drafts.records import AnswerTokens
from app.lifecycle.outbox import send_and_mark
from app.lifecycle.queries import create_query, get_or_create_tenant, wait_for
from app.requests import validate_request
from app.settings import Settings
from tests.integration.conftest import CORPUS_FILES, REPO_ROOT, Deployment
from tests.integration.helpers import WorkerProcess
from tests.waiting import wait_until
from workers import create_celery, send_query

QUESTION = "What does the assert statement do?"
TENANTS = ("acme", "globex", "initech")
"""A and C hold an answer to the question, B none."""


@dataclass
class Asked:
    """A stored answer's output ids and its drafting counters."""

    token_ids: list[int]
    drafts: tuple[Any, ...]
    accepted: int


@pytest.fixture
def suffix_deployment(private_deployment: Deployment) -> Iterator[tuple[Settings, Any]]:
    """The deployment with the collection ``docs`` in every tenant and its periodic sync far
    off (only the Redis stream can bring one worker's answers to another in these tests)."""
    from app.resources import Resources

    settings = private_deployment.settings.model_copy(
        update={"suffix_sync_seconds": 600.0, "default_max_tokens": 24}
    )
    engine = make_engine(settings)
    sf = make_session_factory(engine)
    corpus = REPO_ROOT / "demo" / "corpus"
    retrieval = Resources(settings, sf).retrieval
    for tenant in TENANTS[1:]:
        retrieval.ingest([corpus / n for n in CORPUS_FILES], collection="docs", tenant=tenant)
    yield settings, sf
    engine.dispose()


def ask(
    settings: Settings, sf: sessionmaker[Session], tenant: str, method: str, queue: str = "answer"
) -> Asked:
    """Ask ``QUESTION`` as ``tenant`` on ``queue`` and wait for its recorded answer."""
    celery = create_celery(settings)
    with sf() as session:
        owner = get_or_create_tenant(session, tenant)
        request = validate_request(
            settings, {"question": QUESTION, "collection": "docs", "method": method}
        )
        query, _ = create_query(session, owner, request, queue=queue)
    send_and_mark(sf, query.id, queue, lambda q, name: send_query(celery, q, name))
    done = wait_for(sf, query.id, timeout=180)
    assert done.status == "succeeded", done.error
    return _asked(sf, query.id)


def _asked(sf: sessionmaker[Session], qid: uuid.UUID) -> Asked:
    """The answer's stats and output ids. The ids are stored by an after-answer hook
    (app/drafts/hooks.py), after the answer is recorded ``succeeded``: wait for them."""

    def read() -> tuple[GenerationStatsRecord, list[int]] | None:
        with sf() as session:
            stats = session.scalar(
                select(GenerationStatsRecord).where(GenerationStatsRecord.query_id == qid)
            )
            ids = session.scalar(
                select(AnswerTokens.output_token_ids).where(AnswerTokens.query_id == qid)
            )
        return (stats, list(ids)) if stats is not None and ids is not None else None

    stats, ids = wait_until(read, 30, f"query {qid}'s stats and stored token ids")
    drafts = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
              tuple(stats.accepted_per_position or ()))  # fmt: skip
    return Asked(list(ids), drafts, int(stats.num_accepted_tokens or 0))


def test_a_tenants_answer_is_never_drafted_for_another_tenants_identical_question(
    suffix_deployment: tuple[Settings, Any], worker_process: Callable[..., WorkerProcess]
) -> None:
    settings, sf = suffix_deployment
    worker_process(settings, "suffix").wait_ready()
    a, b, c = TENANTS
    fresh = ask(settings, sf, c, "suffix")  # no answer stored anywhere yet: prompt-only drafts
    planted = ask(settings, sf, a, "none")  # A's answer to the same question
    b_asks = ask(settings, sf, b, "suffix")
    a_again = ask(settings, sf, a, "suffix")
    # Same greedy answer everywhere: the trees change drafts, never answers.
    answers = {tuple(x.token_ids) for x in (fresh, planted, b_asks, a_again)}
    assert answers == {tuple(planted.token_ids)}
    # B drafts exactly as when no tree held any answer (neither A's nor C's leaked into it) ...
    assert b_asks.drafts == fresh.drafts
    # ... while A drafts its own past answer: the check above can tell a tree that holds it.
    assert a_again.accepted > fresh.accepted, (a_again.drafts, fresh.drafts)


def test_an_answer_recorded_by_one_worker_is_drafted_by_another_within_seconds(
    suffix_deployment: tuple[Settings, Any], worker_process: Callable[..., WorkerProcess]
) -> None:
    settings, sf = suffix_deployment
    first = worker_process(settings, "first", queues="answer")
    second = worker_process(settings, "second", queues="batch")
    first.wait_ready()
    second.wait_ready()
    a, _, c = TENANTS
    fresh = ask(settings, sf, c, "suffix", queue="batch")  # the second worker, no history
    ask(settings, sf, a, "none", queue="answer")  # recorded by the first worker
    time.sleep(2.0)  # "within seconds": the second worker's sync is 600 s away
    heard = ask(settings, sf, a, "suffix", queue="batch")
    assert heard.accepted > fresh.accepted, (heard.drafts, fresh.drafts)
    # A restart forgets nothing: a new worker fills its trees from the database.
    second.stop()
    worker_process(settings, "third", queues="batch").wait_ready()
    again = ask(settings, sf, a, "suffix", queue="batch")
    assert again.drafts == heard.drafts
