"""Shadow sampling: re-decode a sample of production answers greedily without speculation.

Speculative decoding promises that greedy output is token-identical to the target's own greedy
decoding. A sampled query (fraction ``shadow_sample_rate`` of greedy, speculative answers) gets
its prompt and output token ids copied into ``shadow_runs`` right after its answer is recorded;
a task on the ``batch`` queue then decodes the same prompt with method ``none`` and stores the
baseline output and its timing. The report turns them into a measured speedup per segment and
counts every differing token as an exactness violation (which must never happen).

Only temperature-0 queries are sampled: with sampling, two runs legitimately differ.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.audit.aggregate import EVAL_QUEUE
from app.audit.records import ShadowRun
from app.db.models import Query, utcnow
from app.requests import Method
from app.settings import Settings

log = logging.getLogger(__name__)


def is_sampled(query_id: uuid.UUID, rate: float) -> bool:
    """Whether ``query_id`` falls in the sample: a fixed function of the id, so retries agree."""
    if rate <= 0:
        return False
    return int(query_id.hex[:8], 16) / 0x1_0000_0000 < rate


def sample(
    session_factory: sessionmaker[Session],
    settings: Settings,
    query_id: uuid.UUID,
    *,
    params: dict[str, Any],
    prompt_ids: list[int],
    output_ids: list[int],
) -> bool:
    """Store a pending shadow run for an answered query when it is sampled; True if stored.

    Skipped (False) when sampling is off, the query is not greedy or not speculative, it is not
    in the sample, or it already has a shadow run (a redelivered task).
    """
    greedy = float(params.get("temperature") or 0.0) == 0.0
    speculative = params.get("method") != Method.NONE
    if not (greedy and speculative and is_sampled(query_id, settings.shadow_sample_rate)):
        return False
    with session_factory() as session:
        queue = session.scalar(select(Query.queue).where(Query.id == query_id))
        if queue == EVAL_QUEUE:
            return False  # golden evaluations decode their own baseline
        session.add(
            ShadowRun(
                query_id=query_id,
                status="pending",
                max_new_tokens=int(params["max_tokens"]),
                prompt_token_ids=[int(t) for t in prompt_ids],
                speculative_token_ids=[int(t) for t in output_ids],
            )
        )
        try:
            session.commit()
        except IntegrityError:
            session.rollback()  # a redelivered task: the first run's sample stands
            return False
        except SQLAlchemyError:
            # Sampling is best effort: the answer is recorded already and must stay a success.
            session.rollback()
            log.exception("could not store the shadow sample of query %s", query_id)
            return False
    return True


def is_pending(session_factory: sessionmaker[Session], query_id: uuid.UUID | str) -> bool:
    """Whether ``query_id`` has a shadow run waiting for its baseline."""
    qid = query_id if isinstance(query_id, uuid.UUID) else uuid.UUID(str(query_id))
    with session_factory() as session:
        status = session.scalar(select(ShadowRun.status).where(ShadowRun.query_id == qid))
    return status == "pending"


def compare(speculative: list[int], baseline: list[int]) -> tuple[int, int | None]:
    """Mismatched token count (a length difference counts per missing token), first mismatch."""
    mismatched = sum(a != b for a, b in zip(speculative, baseline, strict=False))
    mismatched += abs(len(speculative) - len(baseline))
    first = next(
        (i for i, (a, b) in enumerate(zip(speculative, baseline, strict=False)) if a != b),
        None if len(speculative) == len(baseline) else min(len(speculative), len(baseline)),
    )
    return mismatched, first


def run_shadow(
    session_factory: sessionmaker[Session], engine: Any, tokenizer: Any, query_id: uuid.UUID | str
) -> str:
    """Decode a pending shadow run's prompt greedily with method "none" and store the baseline.

    Returns "done", "violation" (outputs differ: logged as an error), "failed", or "skipped"
    (no pending run: already taken by another delivery of the task).
    """
    from generation import SamplingParams  # heavy: torch

    qid = query_id if isinstance(query_id, uuid.UUID) else uuid.UUID(str(query_id))
    with session_factory() as session:
        claimed = session.execute(
            update(ShadowRun)
            .where(ShadowRun.query_id == qid, ShadowRun.status == "pending")
            .values(status="running")
        )
        session.commit()
        if getattr(claimed, "rowcount", 0) != 1:
            return "skipped"
        run = session.scalars(select(ShadowRun).where(ShadowRun.query_id == qid)).one()
        prompt, max_new, spec = (
            list(run.prompt_token_ids),
            run.max_new_tokens,
            run.speculative_token_ids,
        )
    try:
        params = SamplingParams(max_new_tokens=max_new, temperature=0.0, method="none")
        t0 = time.perf_counter()
        result = engine.generate(prompt, params)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        baseline = [int(t) for t in result.token_ids]
        text = tokenizer.decode(baseline, skip_special_tokens=True).strip() if tokenizer else None
    except Exception as exc:
        _finish(session_factory, qid, status="failed", error=f"{type(exc).__name__}: {exc}")
        log.warning("shadow run of query %s failed: %s", qid, exc)
        return "failed"
    mismatched, first = compare(list(spec), baseline)
    _finish(
        session_factory,
        qid,
        status="done",
        baseline_token_ids=baseline,
        baseline_text=text,
        baseline_generation_ms=result.stats.generation_ms or elapsed_ms,
        baseline_ttft_ms=result.stats.ttft_ms,
        mismatched_tokens=mismatched,
        first_mismatch=first,
    )
    if mismatched:
        log.error(
            "exactness violation: query %s speculative output differs from greedy decoding "
            "without speculation in %d token(s), first at position %s",
            qid,
            mismatched,
            first,
        )
        return "violation"
    return "done"


def _finish(session_factory: sessionmaker[Session], qid: uuid.UUID, **values: Any) -> None:
    with session_factory() as session:
        session.execute(
            update(ShadowRun)
            .where(ShadowRun.query_id == qid)
            .values(finished_at=utcnow(), **values)
        )
        session.commit()
