"""Answering one stored query, step by step. Knows no Celery and nothing of audit.

    claim (app/lifecycle/lease.py) → retrieve → build the request (prompt ids, SamplingParams, cited
    passages) → generate → record (answer, sources, stats and the final status in one
    transaction) → after-answer hooks (app/hooks.py: shadow sampling, metrics, ...)

The query id is the idempotency key: the claim lets one run in, and the unique
``answers.query_id`` and ``generation_stats.query_id`` make sure that even two runs racing to the
end (a worker presumed dead that was not) record one answer. A query becomes final only through
``app.lifecycle.finish.finish_query``, which also stores the question in its kept form.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.collection_prompts import stored_system_prompt
from app.db import Answer, AnswerSource, GenerationStatsRecord, Query, utcnow
from app.db.models import as_utc
from app.hooks import Answered, run_after_answer, when_done
from app.lifecycle.failures import public_error
from app.lifecycle.finish import finish_query
from app.lifecycle.handback import engine_died, fail, hand_back, not_the_querys
from app.lifecycle.lease import Claimed, await_hand_back, claim, heartbeat
from app.lifecycle.outage import with_database
from app.requests import Method, QueryStatus, served_methods
from app.resources import Resources
from app.settings import Settings
from app.streams import QueryStream, open_stream
from app.suffix import scope_of
from app.tracing import current_trace_id, current_traceparent, span
from app.tracing import genai as traced
from retrieval.prompt import fit_passages

if TYPE_CHECKING:  # generation imports torch: loaded with the engine, not with this module
    from generation import GenerationResult, SamplingParams
    from generation.interface import DeltaCallback, RequestHandle

log = logging.getLogger(__name__)

Outcome = Literal[
    "succeeded", "failed", "skipped", "duplicate", "missing", "released", "superseded"
]
"""What happened to a query; "released": its request was cancelled in the engine loop (batch
preemption, worker shutdown), its engine died or the database stayed away, and the query is
queued again with nothing recorded; "superseded": a newer attempt holds the query (this one
stalled past its lease), so this attempt's result was dropped."""
MIN_PROMPT_BUDGET = 16
"""Fewest context tokens that must remain for the prompt after the answer's ``max_tokens``."""


@dataclass(frozen=True)
class Retrieved:
    """The retrieve step's result: passages, the index version they came from, its timing."""

    hits: list[Any]
    index_version: int | None
    retrieval_ms: float
    retrieved_at: datetime


@dataclass(frozen=True)
class BuiltRequest:
    """What the engine is asked: prompt token ids and sampling, and the passages the prompt cites."""

    prompt_ids: list[int]
    sampling: SamplingParams
    cited: list[Any]
    prompt_format: str = "raw"
    """``chat`` (the target tokenizer's chat template) or ``raw``: recorded in the stats."""


GenerateStep = Callable[[BuiltRequest, "DeltaCallback | None"], "GenerationResult"]
"""The generate step: a request (and an optional callback for verified token bursts) to a result."""


def answer_query(
    resources: Resources,
    query_id: uuid.UUID | str,
    host: str | None = None,
    *,
    on_delta: DeltaCallback | None = None,
    generate_step: GenerateStep | None = None,
) -> Outcome:
    """Answer one stored query and record the result; returns what happened to it.

    ``generate_step`` replaces the engine's blocking ``generate`` (an engine loop shared by many
    queries); ``on_delta`` gets each burst of verified token ids as it lands.
    """
    qid = query_id if isinstance(query_id, uuid.UUID) else uuid.UUID(str(query_id))
    with span("answer query", {"specrag.query.id": str(qid)}) as current:
        outcome = _claim_and_answer(resources, qid, host, on_delta, generate_step)
        if current is not None:
            current.set_attribute("specrag.query.outcome", outcome)
        return outcome


def _claim_and_answer(
    resources: Resources,
    qid: uuid.UUID,
    host: str | None,
    on_delta: DeltaCallback | None,
    generate_step: GenerateStep | None,
) -> Outcome:
    sf = resources.session_factory
    s = resources.settings
    window = s.database_retry_seconds
    # A claim the database cannot take raises DatabaseUnavailable: the caller keeps the message.
    with span("claim"):
        claimed = with_database(
            lambda: claim(sf, qid, host or socket.gethostname()),
            seconds=window,
            what=f"query {qid}",
        )
    if claimed is None:
        status = with_database(lambda: _status(sf, qid), seconds=window, what=f"query {qid}")
        log.info("query %s not claimed (status %s)", qid, status)
        return "missing" if status is None else "skipped"
    step = generate_step or (lambda built, deltas: generate(resources.engine, built, deltas))
    with heartbeat(sf, qid, claimed.attempt, s.heartbeat_seconds, float(s.task_time_limit)):
        # Token bursts for GET /v1/queries/{id}/stream (a no-op without a stream Redis), fenced
        # by the attempt: once a newer attempt writes to the stream, this one's are refused.
        stream = open_stream(resources, qid, claimed.attempt)
        try:
            outcome, pending = _answer(
                resources, qid, claimed, step, stream.chain(on_delta), stream
            )
            if outcome == QueryStatus.SUCCEEDED:
                # After the commit, so readers find the final state; and after the hooks' work
                # in other threads (grounding), so ``done`` carries it. The task is free now.
                when_done(pending, lambda: stream.end(QueryStatus.SUCCEEDED))
            return outcome
        except BaseException as exc:
            if isinstance(exc, Exception) and engine_died(resources, exc):
                log.warning("query %s: the engine died (%s); handed back", qid, type(exc).__name__)
                await_hand_back()  # a worker's guard releases it and ends the process
                hand_back(resources, qid, claimed.attempt)  # no guard here: release it now
                return "released"
            if _cancelled(exc) or (isinstance(exc, Exception) and not_the_querys(resources, exc)):
                # Cancelled at a step boundary (preempted, shut down), the database away, or the
                # engine dead: nothing was recorded and the query did nothing wrong.
                log.warning("query %s handed back (%s); queued again", qid, type(exc).__name__)
                hand_back(resources, qid, claimed.attempt)
                return "released"
            if not isinstance(exc, Exception):
                # Shutdown or interrupt: not the query's fault, so it goes back on the outbox.
                hand_back(resources, qid, claimed.attempt)
                raise
            # Anything else (bad collection, out of context, time limit) fails the query with a
            # message the client can read; a killed process never gets here (the reaper does).
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            # The client gets a stable message (app/lifecycle/failures.py); the exception's text is logged.
            log.warning("query %s failed: %s", qid, message, exc_info=exc)
            if not fail(resources, qid, claimed, public_error(exc)):
                return "superseded"
            stream.end(QueryStatus.FAILED)
            run_after_answer(resources, _answered(resources, qid, claimed, QueryStatus.FAILED))
            return "failed"


def _status(sf: sessionmaker[Session], qid: uuid.UUID) -> str | None:
    with sf() as session:
        return session.scalar(select(Query.status).where(Query.id == qid))


def _answer(
    resources: Resources,
    qid: uuid.UUID,
    claimed: Claimed,
    generate_step: GenerateStep,
    on_delta: DeltaCallback | None,
    stream: QueryStream,
) -> tuple[Outcome, list[Future[Any]]]:
    """The query answered and recorded; with the futures of the after-answer hooks' work."""
    retrieved = retrieve(resources, claimed)
    with span("prompt build", {"specrag.prompt.passages": len(retrieved.hits)}) as current:
        built = build_request(resources, claimed, retrieved.hits)
        if current is not None:
            current.set_attribute("specrag.prompt.tokens", len(built.prompt_ids))
    generation_started = utcnow()
    with traced.generation_span(
        resources.settings, claimed.params, built.prompt_format, len(built.prompt_ids)
    ) as current:
        result = generate_step(built, on_delta)
        if current is not None:
            current.set_attributes(
                traced.result_attributes(result.stats.to_dict(), built.sampling.max_new_tokens)
            )
            if traced.content_allowed(resources.settings):
                text = answer_text(resources, result.token_ids)
                current.set_attributes(traced.content_attributes(claimed.question, text))
    # Queued, not written here: ids never delivered as deltas and the text held back, so that the
    # streamed texts add up to exactly the stored answer.
    stream.finish(answer_text(resources, result.token_ids), list(result.token_ids))
    outcome = record(resources, qid, claimed, retrieved, built, result, generation_started)
    if outcome == QueryStatus.SUCCEEDED:
        answered = _answered(resources, qid, claimed, QueryStatus.SUCCEEDED, built, result)
        return outcome, run_after_answer(resources, answered)
    return outcome, []


def retrieve(resources: Resources, claimed: Claimed) -> Retrieved:
    """The passages for the claimed question from its tenant's collection, timed."""
    with span(
        f"retrieval {claimed.collection}",
        {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.data_source.id": claimed.collection,
            "gen_ai.retrieval.top_k": resources.settings.default_top_k,
        },
    ):
        return _retrieve(resources, claimed)


def _retrieve(resources: Resources, claimed: Claimed) -> Retrieved:
    tenant = resources.tenant_name(claimed.tenant_id)
    started = time.perf_counter()
    retrieval = resources.retrieval
    hits = retrieval.search(
        claimed.question,
        collection=claimed.collection,
        tenant=tenant,
        top_k=resources.settings.default_top_k,
    )
    # The version the hits came from; read separately it could already be a newer re-index.
    index_version = (
        hits[0].index_version
        if hits
        else retrieval.index_version(collection=claimed.collection, tenant=tenant)
    )
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    return Retrieved(list(hits), index_version, elapsed_ms, utcnow())


def build_request(resources: Resources, claimed: Claimed, hits: list[Any]) -> BuiltRequest:
    """The numbered prompt within the target's context budget, as token ids, and its sampling.

    The prompt is the target tokenizer's chat template (system message: the collection's own
    system prompt, else ``SPECRAG_SYSTEM_PROMPT``) or, without a template, the raw text; the
    budget counts every token of it, template and special tokens included.
    """
    from generation import SamplingParams  # heavy: torch

    engine, fmt, params = resources.engine, resources.prompt_format, claimed.params
    served = served_methods(resources.settings)
    if params["method"] not in served:  # an API whose settings differ from this worker's
        raise ValueError(f"method: this worker serves {', '.join(served)}, not {params['method']}")
    max_tokens = int(params["max_tokens"])
    budget = engine.max_context - max_tokens
    if budget <= MIN_PROMPT_BUDGET:
        raise ValueError(
            f"max_tokens: {max_tokens} leaves no room for a prompt in a {engine.max_context}-token context"
        )
    system = None
    if fmt.name == "chat":
        with resources.session_factory() as session:
            system = stored_system_prompt(session, claimed.tenant_id, claimed.collection)
        if system is not None:
            system = fmt.check_system_prompt(system)  # over the token limit: the query fails

    def encode(passages: list[Any]) -> list[int]:
        return fmt.encode(claimed.question, passages, system)

    passages, cited = fit_passages(claimed.question, hits, lambda ps: len(encode(ps)), budget)
    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=float(params["temperature"]),
        seed=params.get("seed"),
        method=params["method"],
        num_speculative_tokens=params["num_speculative_tokens"],
        # Cached prompt KV is shared within a tenant only: a hit's speed is a timing side channel.
        cache_salt=f"tenant-{claimed.tenant_id}",
        # Drafts from this tenant's own past answers in this collection, for the same reason.
        suffix_scope=scope_of(claimed.tenant_id, claimed.collection)
        if params["method"] == Method.SUFFIX
        else None,
    )
    return BuiltRequest(encode(passages), sampling, cited, fmt.name)


def generate(
    engine: Any, built: BuiltRequest, on_delta: DeltaCallback | None = None
) -> GenerationResult:
    """The generate step on the engine's blocking ``generate``: its deltas arrive as one burst."""
    result: GenerationResult = engine.generate(built.prompt_ids, built.sampling)
    if on_delta is not None and result.token_ids:
        on_delta(list(result.token_ids))
    return result


def loop_step(
    resources: Resources,
    on_submit: Callable[[RequestHandle], None] | None = None,
    *,
    background: bool = False,
) -> GenerateStep:
    """The generate step on the process's engine loop (``resources.loop``), shared by many queries.

    The calling (task) thread waits while the loop generates for it and for the other requests
    in flight; retrieval and recording happen in the task threads, beside the loop. ``on_submit``
    gets the request's handle (a preemptor may cancel it: the query is then released). A request
    still running at the soft time limit is cancelled, freeing its slot, and the query fails.
    ``background``: batch items, which the loop keeps behind interactive queries.
    """

    def step(built: BuiltRequest, on_delta: DeltaCallback | None) -> GenerationResult:
        # Inside the generation span: an engine with spans of its own (vLLM) makes them children.
        traceparent = current_traceparent()
        handle = resources.loop.submit(
            built.prompt_ids,
            built.sampling,
            on_delta=on_delta,
            background=background,
            trace_headers={"traceparent": traceparent} if traceparent else None,
        )
        if on_submit is not None:
            on_submit(handle)
        limit = float(resources.settings.task_soft_time_limit)
        try:
            result: GenerationResult = handle.result(timeout=limit)
        except TimeoutError:
            handle.cancel()
            raise TimeoutError(f"generation passed the {limit:.0f} s time limit") from None
        except BaseException:
            handle.cancel()  # an interrupted wait must not leave the request in the loop
            raise
        return result

    return step


def _cancelled(exc: BaseException) -> bool:
    # generation (torch) is imported by whoever runs a loop; without it nothing was cancelled.
    base = sys.modules.get("generation.interface")
    return base is not None and isinstance(exc, base.Cancelled)


def answer_text(resources: Resources, token_ids: list[int]) -> str:
    """The stored answer for generated ``token_ids``: decoded without special tokens, stripped."""
    return str(resources.tokenizer.decode(token_ids, skip_special_tokens=True)).strip()


def record(
    resources: Resources,
    qid: uuid.UUID,
    claimed: Claimed,
    retrieved: Retrieved,
    built: BuiltRequest,
    result: GenerationResult,
    generation_started: datetime,
) -> Outcome:
    """Store the answer text, its sources and stats, and the query's final status, at once."""
    text = answer_text(resources, result.token_ids)
    stats = result.stats
    done_at = utcnow()
    stats.retrieval_ms = retrieved.retrieval_ms
    stats.prompt_format = built.prompt_format
    stats.queue_ms = _ms(claimed.started_at, claimed.queued_at)
    stats.total_ms = _ms(done_at, claimed.queued_at)
    first_token_at = (
        generation_started + timedelta(milliseconds=stats.ttft_ms)
        if stats.ttft_ms is not None
        else None
    )
    stats_dict = stats.to_dict()
    stats_dict["trace_id"] = current_trace_id()
    with span("record"):
        return with_database(
            lambda: _record(
                resources.session_factory,
                resources.settings,
                qid,
                attempt=claimed.attempt,
                question=claimed.question,
                text=text,
                cited=built.cited,
                stats=stats_dict,
                model_pair=resources.engine.model_pair,
                engine_kind=resources.settings.engine,
                index_version=retrieved.index_version,
                prompt_tokens=len(built.prompt_ids),
                times={
                    "retrieved_at": retrieved.retrieved_at,
                    "first_token_at": first_token_at,
                    "done_at": done_at,
                },
            ),
            seconds=resources.settings.database_retry_seconds,
            what=f"answer of query {qid}",
        )


def _record(
    sf: sessionmaker[Session],
    settings: Settings,
    qid: uuid.UUID,
    *,
    attempt: int,
    question: str | None,
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
                    dense_rank=hit.dense_rank,
                    lexical_rank=hit.lexical_rank,
                )
                for rank, hit in enumerate(cited, start=1)
            ],
        )
        fields = {n: stats.get(n) for n in GenerationStatsRecord.STAT_FIELDS}
        fields["num_speculative_tokens"] = None if k is None else str(k)
        fields["accepted_per_position"] = list(stats.get("accepted_per_position") or [])
        try:
            # The lease first: the UPDATE moves the query only for the attempt holding it.
            moved = finish_query(
                session,
                settings,
                qid,
                QueryStatus.SUCCEEDED,
                question=question,
                where=(Query.attempts == attempt,),  # the lease: only the attempt holding it
                times=times,
            )
            if not moved:
                # The reaper gave the query to a newer attempt (this one stalled past its lease),
                # or it is final already: nothing of this run is kept.
                session.rollback()
                log.info("query %s: attempt %d no longer holds it; answer dropped", qid, attempt)
                return "superseded"
            session.add(answer)
            session.add(GenerationStatsRecord(query_id=qid, **fields))
            # The flush (at the commit) is where a second answer would hit the unique key.
            session.commit()
        except IntegrityError:
            # Another run of this query recorded its answer first: the unique constraint decided.
            session.rollback()
            log.info("query %s already answered; this run's result dropped", qid)
            return "duplicate"
    return "succeeded"


def _answered(
    resources: Resources,
    qid: uuid.UUID,
    claimed: Claimed,
    status: QueryStatus,
    built: BuiltRequest | None = None,
    result: GenerationResult | None = None,
) -> Answered:
    try:
        tenant: str | None = resources.tenant_name(claimed.tenant_id)
    except LookupError:  # a failure's report must not fail in turn
        tenant = None
    return Answered(
        query_id=qid,
        status=status,
        queue=claimed.queue,
        tenant=tenant,
        stats=result.stats.to_dict() if result is not None else None,
        model_pair=resources.engine.model_pair if result is not None else None,
        method=claimed.params.get("method"),
        prompt_token_ids=list(built.prompt_ids) if built is not None else [],
        output_token_ids=list(result.token_ids) if result is not None else [],
        params=claimed.params,
    )


def _ms(later: datetime, earlier: datetime) -> float:
    return (as_utc(later) - as_utc(earlier)).total_seconds() * 1000.0
