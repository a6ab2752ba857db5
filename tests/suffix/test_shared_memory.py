"""The shared suffix memory on real PostgreSQL and Redis: filled from the stored answers, bounded
per scope, scoped by tenant and collection, heard across workers, pruned when answers go.

The trees themselves are a recording stand-in (``Trees``): what is tested here is which answers
reach them and leave them; the engine's trees are tested with the engine (tests/generation), and
the two together through a live worker (tests/integration/test_suffix_service.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, delete, update
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Query, Tenant
from app.drafts.records import AnswerTokens
from app.lifecycle.queries import get_or_create_tenant
from app.suffix import SharedSuffixMemory, request_sync, scope_of

VOCAB = 100


class Trees:
    """The engine's SuffixMemory with a view of which answers each scope's tree holds."""

    def __init__(self, max_answers: int) -> None:
        from generation.spec_decode.suffix import SuffixMemory

        self.memory = SuffixMemory(max_answers_per_scope=max_answers)
        self.memory.set_vocab_size(VOCAB)  # what the engine that takes it does
        self.shared: SharedSuffixMemory | None = None

    def scopes(self) -> list[str]:
        return self.memory.scopes()

    def ids(self, scope: str) -> set[uuid.UUID]:
        assert self.shared is not None
        held = self.shared.held(scope)
        assert self.memory.size(scope) == len(held)  # the trees hold what the service says
        return held

    def proposes(self, scope: str, context: list[int], k: int = 8) -> list[int]:
        return self.memory.speculate(scope, context, k, 4.0, 0.0).token_ids


@pytest.fixture
def sf(migrated_pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(migrated_pg_url)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


@pytest.fixture
def make(
    sf: sessionmaker[Session], private_redis_db: str
) -> Iterator[Callable[..., tuple[SharedSuffixMemory, Trees]]]:
    started: list[SharedSuffixMemory] = []

    def build(
        max_answers: int = 5, sync_seconds: float = 60.0, redis: bool = True, prompt_tokens: int = 0
    ) -> tuple[SharedSuffixMemory, Trees]:
        trees = Trees(max_answers)
        shared = trees.shared = SharedSuffixMemory(
            trees.memory,
            sf,
            max_answers=max_answers,
            sync_seconds=sync_seconds,
            feed_url=private_redis_db if redis else None,
            prompt_tokens=prompt_tokens,
        )
        started.append(shared.start())
        return shared, trees

    yield build
    for shared in started:
        shared.stop()


def answer(
    sf: sessionmaker[Session],
    tenant: str,
    output: Any,
    *,
    collection: str = "docs",
    stored: str | None = None,
    prompt: Any = (1,),
) -> uuid.UUID:
    """A succeeded query of ``tenant`` whose stored output (and prompt) ids are ``output`` (and
    ``prompt``), as written."""
    with sf() as session:
        t = get_or_create_tenant(session, tenant)
        q = Query(tenant_id=t.id, collection=collection, question="q?", status="succeeded",
                  params={"method": "suffix"}, question_stored=stored)  # fmt: skip
        session.add(q)
        session.flush()
        session.add(
            AnswerTokens(
                query_id=q.id,
                prompt_token_ids=list(prompt) if isinstance(prompt, tuple) else prompt,
                output_token_ids=output,
            )
        )
        session.commit()
        return q.id


def scope(sf: sessionmaker[Session], tenant: str, collection: str = "docs") -> str:
    with sf() as session:
        return scope_of(get_or_create_tenant(session, tenant).id, collection)


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> float:
    """Seconds until ``check`` held; fails the test after ``seconds``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "not within the time allowed"
        time.sleep(0.05)
    return time.monotonic() - started


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def test_start_fills_the_most_recent_answers_of_each_scope(sf: Any, make: Any) -> None:
    a, b = _tenant(), _tenant()
    a_ids = [answer(sf, a, [i, i + 1, i + 2]) for i in range(7)]
    other = answer(sf, a, [50, 51], collection="manuals")
    b_ids = [answer(sf, b, [60, 61])]
    shared, trees = make(max_answers=5)
    assert trees.ids(scope(sf, a)) == set(a_ids[-5:])
    assert trees.proposes(scope(sf, a), [6, 7]) == [8]
    assert trees.proposes(scope(sf, a), [0, 1]) == []  # the oldest answers are out
    assert trees.ids(scope(sf, a, "manuals")) == {other}
    assert trees.ids(scope(sf, b)) == set(b_ids)


def test_private_questions_and_foreign_ids_never_reach_the_trees(
    sf: Any, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    t = _tenant()
    good = answer(sf, t, [1, 2, 3])
    answer(sf, t, [1, 2, 3], stored="hashed")
    answer(sf, t, [1, 2, 3], stored="redacted")
    corrupt = [
        answer(sf, t, bad)
        for bad in ([1, VOCAB], [-1, 2], [1, "2"], [True, 2], {"ids": [1]}, "1 2 3", [1.5])
    ]
    with caplog.at_level(logging.WARNING):
        shared, trees = make(max_answers=50)
        shared.sync()  # a refused row is logged once, not at every sync
    assert trees.ids(scope(sf, t)) == {good}
    # The session's database holds other tests' answers too: count the lines about this tenant's.
    scope_name = scope(sf, t)
    logged = [
        r.getMessage()
        for r in caplog.records
        if "skipped" in r.getMessage() and f"of scope {scope_name} " in r.getMessage()
    ]
    assert len(logged) == len(corrupt), logged
    assert all(any(str(q) in m for m in logged) for q in corrupt)


def test_a_tenants_answers_are_never_proposed_for_another_tenant(sf: Any, make: Any) -> None:
    a, b = _tenant(), _tenant()
    planted = [91, 17, 93, 42, 95, 96, 13, 98]
    answer(sf, a, planted)
    answer(sf, b, [1, 2, 3, 4])
    shared, trees = make()
    proposed = trees.proposes(scope(sf, a), planted[:2])
    assert proposed and proposed == planted[2 : 2 + len(proposed)]
    for context in (planted[:2], planted[:5], planted):
        assert trees.proposes(scope(sf, b), context) == []
    assert trees.proposes(scope(sf, a, "other"), planted[:2]) == []


def test_an_answer_recorded_by_one_worker_is_heard_by_another(sf: Any, make: Any) -> None:
    t = _tenant()
    first, first_trees = make()
    second, second_trees = make()
    qid = answer(sf, t, [4, 5, 6])
    first.recorded(qid)
    assert qid in first_trees.ids(scope(sf, t))  # at once, in the worker that recorded it
    waited = eventually(lambda: qid in second_trees.ids(scope(sf, t)), seconds=3.0)
    assert waited < 3.0


def test_without_redis_the_periodic_sync_learns_other_workers_answers(sf: Any, make: Any) -> None:
    t = _tenant()
    shared, trees = make(sync_seconds=0.3, redis=False)
    qid = answer(sf, t, [4, 5, 6])
    eventually(lambda: qid in trees.ids(scope(sf, t)))


def test_a_restart_rebuilds_the_same_trees(sf: Any, make: Any) -> None:
    t = _tenant()
    first, first_trees = make()
    for i in range(3):
        first.recorded(answer(sf, t, [i, 9]))
    first.stop()
    _, again = make()
    assert again.ids(scope(sf, t)) == first_trees.ids(scope(sf, t))
    assert again.proposes(scope(sf, t), [0, 2]) == [9]


def test_deleted_tenants_and_scrubbed_questions_leave_the_trees(
    sf: Any, make: Any, private_redis_db: str
) -> None:
    gone, scrubbed, kept = _tenant(), _tenant(), _tenant()
    for t in (gone, scrubbed, kept):
        answer(sf, t, [7, 8, 9])
    shared, trees = make()
    other, other_trees = make()
    gone_scope, scrubbed_scope, kept_scope = (scope(sf, t) for t in (gone, scrubbed, kept))
    for held in (trees, other_trees):
        assert {gone_scope, scrubbed_scope, kept_scope} <= set(held.scopes())
    with sf() as session:  # tenant data deletion: the rows cascade from the tenant
        session.execute(delete(Tenant).where(Tenant.name == gone))
        session.execute(
            update(Query)
            .where(Query.tenant_id == get_or_create_tenant(session, scrubbed).id)
            .values(question="sha256:" + "0" * 64, question_stored="hashed")
        )
        session.commit()
    request_sync(private_redis_db)
    for held in (trees, other_trees):
        eventually(lambda h=held: gone_scope not in h.scopes())
        eventually(lambda h=held: scrubbed_scope not in h.scopes())
        assert kept_scope in held.scopes()


def test_a_full_scope_keeps_the_newest_answers(sf: Any, make: Any) -> None:
    t = _tenant()
    shared, trees = make(max_answers=3)
    ids = []
    for i in range(6):
        ids.append(answer(sf, t, [i]))
        shared.recorded(ids[-1])
    assert trees.ids(scope(sf, t)) == set(ids[-3:])
    shared.sync()
    assert trees.ids(scope(sf, t)) == set(ids[-3:])


def test_the_trees_hold_each_answer_after_its_prompts_last_tokens(
    sf: Any, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    t = _tenant()
    answer(sf, t, [5, 6, 7, 8], prompt=[70, 71, 72, 73])
    bad = answer(sf, t, [5, 6, 7, 8], prompt={"ids": [70]})
    with caplog.at_level(logging.WARNING):
        _, tails = make(prompt_tokens=3, max_answers=50)
    _, outputs = make(max_answers=50)
    # A repeated question's prompt ends the same way: its whole answer is drafted at once.
    assert tails.proposes(scope(sf, t), [9, 71, 72, 73], k=8) == [5, 6, 7, 8]
    assert tails.proposes(scope(sf, t), [9, 70, 71, 72], k=8) == [73, 5, 6, 7, 8]
    # Answers alone: the prompt's end matches nothing (the first prompt token is not held).
    assert outputs.proposes(scope(sf, t), [9, 71, 72, 73], k=8) == []
    assert bad not in tails.ids(scope(sf, t))  # a prompt that is not a list: refused, logged
    assert bad in outputs.ids(scope(sf, t))
    assert any(str(bad) in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
