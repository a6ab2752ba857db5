"""Shadow sampling: re-decode a sample of production answers greedily without speculation.

Speculative decoding promises that greedy output is token-identical to the target's own greedy
decoding. A sampled query (fraction ``shadow_sample_rate`` of greedy, speculative answers) gets
its prompt and output token ids copied into ``shadow_runs`` right after its answer is recorded;
a task on the ``batch`` queue then decodes the same prompt with method ``none`` on the worker's
own engine and stores the baseline output and its timing. The report turns them into a measured
speedup per segment (same engine, same dtype on both sides) and counts exactness violations.

A mismatch is judged (``judge``): in float32, the bit-exact mode, any mismatch is a violation. In
another dtype (bfloat16) a mismatch is *excused* where the reference's top-2 logit gap at the first
differing token is within that dtype's rounding (generation/exactness.py), and a
violation at a clear margin; the logits are float32 ones (``shadow_dtype``) or the engine's own.
An engine that exposes no logits (vLLM) leaves a non-float32 mismatch *unjudged*.

Only temperature-0 queries are sampled: with sampling, two runs legitimately differ.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.audit.aggregate import EVAL_QUEUE
from app.audit.records import ShadowRun
from app.db.models import Query, utcnow
from app.requests import Method
from app.settings import Settings
from app.tracing import enabled, links_to, span

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


@dataclass(frozen=True)
class Judgment:
    """What ``judge`` made of a mismatch (every field None where the outputs are identical)."""

    verdict: str | None = None
    """One of ``records.JUDGMENTS``: "excused", "violation" or "unjudged"."""
    gap: float | None = None
    """The reference's top-1 minus top-2 logit at the first mismatch (None: not computed, or the
    speculative answer runs past the baseline's end)."""
    tolerance: float | None = None
    """The largest gap excused as rounding there."""
    judged_dtype: str | None = None
    """The dtype of the logits behind ``gap`` and ``tolerance``."""
    note: str | None = None
    """Why a mismatch went unjudged."""


def judge(
    engine: Any,
    prompt: list[int],
    baseline: list[int],
    speculative: list[int],
    shadow_dtype: str = "float32",
) -> Judgment:
    """Judge where ``speculative`` differs from ``baseline`` (the engine's greedy ``none`` run).

    float32 engine: a violation whatever the gap (the gap is still measured where the engine can,
    for the report). Another dtype: excused when the reference's top-2 gap at the first mismatch
    is within the rounding (``engine.judge_greedy``), in float32 logits when ``shadow_dtype`` is
    "float32", in the engine's own when "engine"; unjudged where the engine has no
    ``judge_greedy`` (vLLM exposes no logits) or the judgment itself fails.
    """
    if baseline == speculative:
        return Judgment()
    dtype = getattr(engine, "dtype", None)
    judge_greedy = getattr(engine, "judge_greedy", None)
    bit_exact = dtype == "float32"
    if judge_greedy is None:
        if bit_exact:
            return Judgment("violation")
        named = dtype or "unknown-dtype"
        note = f"engine {type(engine).__name__} exposes no logits to judge a {named} mismatch"
        return Judgment("unjudged", note=note)
    reference = None if bit_exact or shadow_dtype == "engine" else shadow_dtype
    try:
        div = judge_greedy(prompt, baseline, speculative, reference_dtype=reference)
    except Exception as exc:  # the judgment is best effort; the mismatch stays on record
        log.warning("could not judge a shadow mismatch: %s: %s", type(exc).__name__, exc)
        if bit_exact:
            return Judgment("violation")
        return Judgment("unjudged", note=f"judgment failed: {type(exc).__name__}: {exc}")
    if div is None:  # identical as far as the judgment can tell: cannot happen here
        return Judgment("violation" if bit_exact else "unjudged", note="no divergence found")
    gap = div.gap if math.isfinite(div.gap) else None
    verdict = "excused" if div.excused and not bit_exact else "violation"
    return Judgment(verdict, gap, div.tolerance, reference or dtype)


def run_shadow(
    session_factory: sessionmaker[Session],
    engine: Any,
    tokenizer: Any,
    query_id: uuid.UUID | str,
    shadow_dtype: str = "float32",
) -> str:
    """Decode a pending shadow run's prompt greedily with method "none" and store the baseline.

    Returns "done" (identical), "violation" (differs at a clear margin, or at all in float32:
    logged as an error), "near_tie" (differs only within the dtype's rounding: logged as info),
    "unjudged" (differs, and no logits could judge it: a warning), "failed", or "skipped" (no
    pending run: already taken by another delivery of the task). ``shadow_dtype``: as the
    setting (``judge``).
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
        with _redecode_span(session_factory, qid, len(prompt)):
            result = engine.generate(prompt, params)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        baseline = [int(t) for t in result.token_ids]
        text = tokenizer.decode(baseline, skip_special_tokens=True).strip() if tokenizer else None
    except Exception as exc:
        _finish(session_factory, qid, status="failed", error=f"{type(exc).__name__}: {exc}")
        log.warning("shadow run of query %s failed: %s", qid, exc)
        return "failed"
    mismatched, first = compare(list(spec), baseline)
    verdict = judge(engine, prompt, baseline, list(spec), shadow_dtype)  # Judgment() if equal
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
        dtype=getattr(engine, "dtype", None),
        judgment=verdict.verdict,
        divergence_gap=verdict.gap,
        divergence_tolerance=verdict.tolerance,
        judged_dtype=verdict.judged_dtype,
        error=verdict.note,
    )
    if not mismatched:
        return "done"
    where = (
        f"query {qid}: speculative output differs from greedy decoding without speculation in "
        f"{mismatched} token(s), first at position {first}"
    )
    margin = f"top-2 gap {verdict.gap} vs tolerance {verdict.tolerance} ({verdict.judged_dtype})"
    if verdict.verdict == "excused":
        log.info("near-tie (excused): %s; %s", where, margin)
        return "near_tie"
    if verdict.verdict == "unjudged":
        log.warning("unjudged mismatch (%s): %s; %s", getattr(engine, "dtype", None), where,
                    verdict.note)  # fmt: skip
        return "unjudged"
    log.error("exactness violation: %s; %s", where, margin)
    return "violation"


def _redecode_span(
    session_factory: sessionmaker[Session], qid: uuid.UUID, prompt_tokens: int
) -> AbstractContextManager[object]:
    """A trace of its own for the baseline decode, linked to the query it re-decodes."""
    if not enabled():
        return nullcontext()
    with session_factory() as session:
        parent = session.scalar(select(Query.traceparent).where(Query.id == qid))
    attrs = {"specrag.query.id": str(qid), "gen_ai.usage.input_tokens": prompt_tokens}
    return span("shadow re-decode", attrs, root=True, links=links_to([parent]))


def _finish(session_factory: sessionmaker[Session], qid: uuid.UUID, **values: Any) -> None:
    with session_factory() as session:
        session.execute(
            update(ShadowRun)
            .where(ShadowRun.query_id == qid)
            .values(finished_at=utcnow(), **values)
        )
        session.commit()
