"""Shadow sampling and question privacy through the real pipeline (tiny models, MiniLM, FAISS)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from app.audit import render_report
from app.audit.records import ShadowRun
from app.db.models import Query, utcnow
from app.evals.shadow import compare, is_sampled, run_shadow
from app.privacy import hash_question, redact_question, stored_form
from tests.audit.conftest import Live


def shadow_of(live: Live, qid: uuid.UUID) -> ShadowRun | None:
    with live.resources.session_factory() as session:
        return session.scalar(select(ShadowRun).where(ShadowRun.query_id == qid))


def report(live: Live) -> dict[str, Any]:
    now = utcnow()
    with live.resources.session_factory() as session:
        body = render_report(
            session, since=now - timedelta(hours=1), until=now + timedelta(minutes=1),
            group_by="method",
        )[1]  # fmt: skip
    return json.loads(body)


def test_greedy_answer_is_sampled_and_its_baseline_matches(live: Live) -> None:
    qid = live.ask("How does the assert statement work?", method="draft_model")
    run = shadow_of(live, qid)
    assert run is not None and run.status == "pending"
    assert run.speculative_token_ids and run.prompt_token_ids
    res = live.resources
    outcome = run_shadow(res.session_factory, res.engine, res.tokenizer, qid)
    assert outcome == "done"
    run = shadow_of(live, qid)
    assert run is not None and run.status == "done" and run.mismatched_tokens == 0
    assert run.baseline_token_ids == run.speculative_token_ids
    assert run.baseline_generation_ms and run.baseline_generation_ms > 0
    # A second delivery of the task finds nothing to do.
    assert run_shadow(res.session_factory, res.engine, res.tokenizer, qid) == "skipped"
    r = report(live)
    assert r["shadow"]["samples"] >= 1 and r["shadow"]["exactness_violations"] == 0
    assert r["shadow"]["speedup"] is not None


def test_sampling_leaves_out_non_greedy_and_non_speculative(live: Live) -> None:
    hot = live.ask("What does pass do?", temperature=0.8, seed=3)
    plain = live.ask("What does del do?", method="none")
    assert shadow_of(live, hot) is None and shadow_of(live, plain) is None


class OffByOne:
    """A broken engine (wraps the real one) whose output differs from the target's in one token:
    the violation a correct engine never produces, so detection needs a deliberately wrong one."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        # Its numerics and the target's logits, so that the mismatch is judged: in
        # bfloat16 (auto, on a CPU with AVX-512 BF16) only a clear margin is a violation.
        self.dtype = engine.dtype
        self.judge_greedy = engine.judge_greedy

    def generate(self, ids: list[int], params: Any) -> Any:
        result = self.engine.generate(ids, params)
        result.token_ids = [result.token_ids[0] + 1, *result.token_ids[1:]]
        return result


def test_a_token_mismatch_is_an_exactness_violation(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    qid = live.ask("Explain the del statement.", method="ngram")
    res = live.resources
    with caplog.at_level(logging.ERROR):
        outcome = run_shadow(res.session_factory, OffByOne(res.engine), res.tokenizer, qid)
    assert outcome == "violation"
    assert any("exactness violation" in r.getMessage() for r in caplog.records)
    run = shadow_of(live, qid)
    assert run is not None and run.mismatched_tokens == 1 and run.first_mismatch == 0
    assert run.judgment == "violation" and run.dtype == res.engine.dtype
    if run.dtype != "float32":  # judged on the target's logits: a clear margin
        assert run.divergence_gap is not None and run.divergence_tolerance is not None
        assert run.divergence_gap > run.divergence_tolerance
    r = report(live)
    assert r["shadow"]["exactness_violations"] == 1
    alerts = [a for a in r["alerts"] if a["kind"] == "exactness_violation"]
    assert alerts and alerts[0]["severity"] == "critical"
    ngram = next(g for g in r["groups"] if g["method"] == "ngram")
    assert ngram["shadow"]["exactness_violations"] == 1


def test_questions_are_stored_hashed_once_answered(live: Live) -> None:
    question = "Is assert removed with -O? Mail me at ann@example.com"
    qid = live.ask(question)
    with live.resources.session_factory() as session:
        stored = session.scalar(select(Query.question).where(Query.id == qid))
    assert stored == hash_question(question) and question not in str(stored)


def test_stored_forms() -> None:
    text = "Call +44 20 7946 0958 or see https://x.example/a?b=1, mail ann.lee@corp.example.com"
    red = redact_question(text)
    assert red == "Call [number] or see [url] mail [email]"
    assert stored_form(text, "clear") == text
    assert stored_form(hash_question(text), "hashed") == hash_question(text)  # idempotent
    assert redact_question(red) == red
    with pytest.raises(ValueError, match="store_questions"):
        stored_form(text, "rot13")


def test_sample_is_a_fixed_fraction_of_ids() -> None:
    ids = [uuid.UUID(int=i * 0x9E3779B97F4A7C15_9E3779B97F4A7C15 % 2**128) for i in range(20000)]
    share = sum(is_sampled(i, 0.1) for i in ids) / len(ids)
    # Binomial(20000, 0.1): 5 standard deviations are 0.0106.
    assert abs(share - 0.1) < 0.0106
    assert not any(is_sampled(i, 0.0) for i in ids[:100])
    assert all(is_sampled(i, 1.0) for i in ids[:100])


def test_compare_counts_length_differences() -> None:
    assert compare([1, 2, 3], [1, 2, 3]) == (0, None)
    assert compare([1, 2, 3], [1, 9, 3]) == (1, 1)
    assert compare([1, 2, 3], [1, 2]) == (1, 2)
