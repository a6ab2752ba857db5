"""Answering one stored query: claim → retrieve → prompt → generate → record. Knows no Celery.

The query id is the idempotency key. ``claim`` moves a query from queued to running atomically, so
a duplicate message finds nothing to do; the unique ``answers.query_id`` and
``generation_stats.query_id`` make sure that even two runs racing to the end (a worker presumed
dead that was not) record one answer. While a query runs, a heartbeat thread refreshes
``queries.heartbeat_at``; when the worker dies the heartbeat stops and the reaper (app/outbox.py)
re-queues the query.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.db import Answer, AnswerSource, GenerationStatsRecord, Query, utcnow
from app.db.session import skip_fsync
from app.resources import Resources

if TYPE_CHECKING:
    from generation import GenerationResult, SamplingParams
    from generation.base import DeltaCallback, RequestHandle

log = logging.getLogger(__name__)

Outcome = Literal["succeeded", "failed", "skipped", "duplicate", "missing", "released"]
"""What happened to a query: "released" means its generation was cancelled (batch preemption,
worker shutdown) and it is queued again, with nothing recorded."""


def _ms(later: datetime, earlier: datetime) -> float:
    return (_aware(later) - _aware(earlier)).total_seconds() * 1000.0


def _aware(dt: datetime) -> datetime:
    # SQLite hands timestamps back without a zone; every stored timestamp is UTC.
    from datetime import UTC

    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Claimed:
    """What a worker needs of a query it has just claimed."""

    attempt: int
    tenant_id: int
    question: str
    collection: str
    params: dict[str, Any]
    queued_at: datetime
    started_at: datetime


def claim(sf: sessionmaker[Session], query_id: uuid.UUID, host: str) -> Claimed | None:
    """Mark a queued query running on ``host`` and return it; None if it is not queued.

    One UPDATE ... RETURNING: the status check and the read are a single round trip.
    """
    now = utcnow()
    with sf() as session:
        skip_fsync(session)
        row = session.execute(
            update(Query)
            .where(Query.id == query_id, Query.status == "queued")
            .values(
                status="running",
                started_at=now,
                heartbeat_at=now,
                worker_host=host,
                attempts=Query.attempts + 1,
            )
            .returning(
                Query.attempts,
                Query.tenant_id,
                Query.question,
                Query.collection,
                Query.params,
                Query.queued_at,
            )
        ).one_or_none()
        session.commit()
    if row is None:
        return None
    return Claimed(row[0], row[1], row[2], row[3], dict(row[4]), row[5], now)


@contextmanager
def heartbeat(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    attempt: int,
    interval: float,
    deadline: float,
) -> Iterator[None]:
    """Refresh the query's heartbeat every ``interval`` seconds until the block ends.

    After ``deadline`` seconds the heartbeat stops on purpose: a hung generation then looks like a
    dead worker to the reaper, which enforces the hard time limit even on pools that cannot.
    """
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(interval):
            if time.monotonic() - started > deadline:
                log.error("query %s passed its time limit; heartbeat stopped", query_id)
                return
            try:
                with session_factory() as session:
                    skip_fsync(session)
                    session.execute(
                        update(Query)
                        .where(
                            Query.id == query_id,
                            Query.status == "running",
                            Query.attempts == attempt,
                        )
                        .values(heartbeat_at=utcnow())
                    )
                    session.commit()
            except Exception:  # a missed beat is not fatal; the next one may succeed
                log.exception("heartbeat of query %s failed", query_id)

    thread = threading.Thread(target=beat, name=f"heartbeat-{query_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def answer_query(
    resources: Resources,
    query_id: uuid.UUID | str,
    host: str | None = None,
    *,
    on_delta: DeltaCallback | None = None,
    on_submit: Callable[[RequestHandle], None] | None = None,
) -> Outcome:
    """Answer one stored query and record the result; returns what happened to it.

    Generation goes to the process's engine loop (``resources.loop``): ``on_delta`` gets each
    burst of verified token ids from the loop's thread, ``on_submit`` the request's handle (so
    that a preemptor can cancel it at a step boundary; the query is then released, not failed).
    """
    from generation.base import Cancelled  # generation (torch) loads in workers only

    qid = query_id if isinstance(query_id, uuid.UUID) else uuid.UUID(str(query_id))
    host = host or socket.gethostname()
    sf = resources.session_factory
    claimed = claim(sf, qid, host)
    if claimed is None:
        with sf() as session:
            status = session.scalar(select(Query.status).where(Query.id == qid))
        log.info("query %s not claimed (status %s)", qid, status)
        return "missing" if status is None else "skipped"
    s = resources.settings
    with heartbeat(sf, qid, claimed.attempt, s.heartbeat_seconds, float(s.task_time_limit)):
        try:
            return _run(resources, qid, claimed, on_delta, on_submit)
        except Cancelled:
            # Preempted or shut down at a step boundary: nothing was recorded; it runs again.
            _release(sf, qid)
            log.info("query %s cancelled in the engine loop; queued again", qid)
            return "released"
        except BaseException as exc:
            # Anything that escapes (bad collection, out of context, time limit) fails the query
            # with a message the client can read; a killed process never gets here (the reaper does).
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if isinstance(exc, Exception):
                _fail(sf, qid, message)
                log.warning("query %s failed: %s", qid, message)
                from app.audit.privacy import scrub_question

                scrub_question(sf, s, qid)  # a failed query is final: keep only its stored form
                return "failed"
            # Shutdown or interrupt: not the query's fault, so it goes back on the outbox.
            _release(sf, qid)
            raise


def _run(
    resources: Resources,
    qid: uuid.UUID,
    claimed: Claimed,
    on_delta: DeltaCallback | None = None,
    on_submit: Callable[[RequestHandle], None] | None = None,
) -> Outcome:
    from generation import SamplingParams
    from retrieval import build_prompt

    sf = resources.session_factory
    tenant = resources.tenant_name(claimed.tenant_id)
    question, collection, params = claimed.question, claimed.collection, claimed.params
    queued_at, started_at = claimed.queued_at, claimed.started_at

    t0 = time.perf_counter()
    retrieval = resources.retrieval
    hits = retrieval.search(
        question, collection=collection, tenant=tenant, top_k=resources.settings.default_top_k
    )
    # The version the hits came from; read separately it could already be a newer re-index.
    index_version = (
        hits[0].index_version
        if hits
        else retrieval.index_version(collection=collection, tenant=tenant)
    )
    retrieval_ms = (time.perf_counter() - t0) * 1000.0
    retrieved_at = utcnow()

    engine, tokenizer = resources.engine, resources.tokenizer
    max_tokens = int(params["max_tokens"])
    budget = engine.max_context - max_tokens
    if budget <= 16:
        raise ValueError(
            f"max_tokens: {max_tokens} leaves no room for a prompt in a {engine.max_context}-token context"
        )

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    prompt, cited = build_prompt(question, hits, count_tokens, budget)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=float(params.get("temperature", 0.0)),
        seed=params.get("seed"),
        method=params.get("method", "draft_model"),
        num_speculative_tokens=params.get("num_speculative_tokens", 4),
    )
    gen_started = utcnow()
    result = generate(resources, prompt_ids, sampling, on_delta, on_submit)
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True).strip()

    stats = result.stats
    done_at = utcnow()
    stats.retrieval_ms = retrieval_ms
    stats.queue_ms = _ms(started_at, queued_at)
    stats.total_ms = _ms(done_at, queued_at)
    first_token_at = (
        gen_started + timedelta(milliseconds=stats.ttft_ms) if stats.ttft_ms is not None else None
    )
    outcome = _record(
        sf,
        qid,
        text=text,
        cited=cited,
        stats=stats.to_dict(),
        model_pair=engine.model_pair,
        engine_kind=resources.settings.engine,
        index_version=index_version,
        prompt_tokens=len(prompt_ids),
        times={"retrieved_at": retrieved_at, "first_token_at": first_token_at, "done_at": done_at},
    )
    if outcome == "succeeded":
        from app.audit import privacy, shadow

        # Audit, once the answer is recorded: maybe a shadow sample (its baseline is decoded
        # later on the batch queue), and the question kept as store_questions says.
        shadow.sample(
            sf, resources.settings, qid, params=params, prompt_ids=prompt_ids,
            output_ids=list(result.token_ids),
        )  # fmt: skip
        privacy.scrub_question(sf, resources.settings, qid)
    return outcome


def generate(
    resources: Resources,
    prompt_ids: list[int],
    sampling: SamplingParams,
    on_delta: DeltaCallback | None = None,
    on_submit: Callable[[RequestHandle], None] | None = None,
) -> GenerationResult:
    """The request's result from the process's engine loop; raises ``Cancelled`` when cancelled.

    The task thread waits here while the loop generates for it and for the other requests in
    flight. A request still running at the soft time limit is cancelled (its slot freed) and the
    query fails with TimeoutError.
    """
    handle = resources.loop.submit(prompt_ids, sampling, on_delta=on_delta)
    if on_submit is not None:
        on_submit(handle)
    limit = float(resources.settings.task_soft_time_limit)
    try:
        return handle.result(timeout=limit)
    except TimeoutError:
        handle.cancel()
        raise TimeoutError(f"generation passed the {limit:.0f} s time limit; cancelled") from None
    except BaseException:
        handle.cancel()  # an interrupted wait must not leave the request running in the loop
        raise


def _record(
    sf: sessionmaker[Session],
    qid: uuid.UUID,
    *,
    text: str,
    cited: list[Any],
    stats: dict[str, Any],
    model_pair: str,
    engine_kind: str,
    index_version: int | None,
    prompt_tokens: int,
    times: dict[str, datetime | None],
) -> Outcome:
    """Write answer, sources, stats and the final status in one transaction (or none of it)."""
    k = stats.get("num_speculative_tokens")
    with sf() as session:
        answer = Answer(
            query_id=qid,
            text=text,
            model_pair=model_pair,
            engine=engine_kind,
            index_version=index_version,
            prompt_tokens=prompt_tokens,
            sources=[
                AnswerSource(
                    rank=rank,
                    document=hit.document,
                    chunk_id=int(hit.chunk_id),
                    score=float(hit.score),
                    title=hit.passage_title,
                    text=hit.text,
                )
                for rank, hit in enumerate(cited, start=1)
            ],
        )
        fields = {n: stats.get(n) for n in GenerationStatsRecord.STAT_FIELDS}
        fields["num_speculative_tokens"] = None if k is None else str(k)
        fields["accepted_per_position"] = list(stats.get("accepted_per_position") or [])
        try:
            session.add(answer)
            session.add(GenerationStatsRecord(query_id=qid, **fields))
            # The flush (here, before the UPDATE) is where a second answer hits the unique key.
            session.execute(
                update(Query)
                .where(Query.id == qid, Query.status.in_(("queued", "running")))
                .values(status="succeeded", error=None, **times)
            )
            session.commit()
        except IntegrityError:
            # Another run of this query recorded its answer first: the unique constraint decided.
            session.rollback()
            log.info("query %s already answered; this run's result dropped", qid)
            return "duplicate"
    return "succeeded"


def _fail(sf: sessionmaker[Session], qid: uuid.UUID, message: str) -> None:
    with sf() as session:
        session.execute(
            update(Query)
            .where(Query.id == qid, Query.status == "running")
            .values(status="failed", error=message[:2000], done_at=utcnow())
        )
        session.commit()


def _release(sf: sessionmaker[Session], qid: uuid.UUID) -> None:
    with sf() as session:
        # Lost in a database crash, the query stays running with a stale heartbeat and the reaper
        # queues it again: no fsync, so that a preempted batch item hands its worker over sooner.
        skip_fsync(session)
        session.execute(
            update(Query)
            .where(Query.id == qid, Query.status == "running")
            .values(status="queued", enqueued_at=None, heartbeat_at=None, worker_host=None)
        )
        session.commit()
