"""The vLLM engine's online loop on the vLLM STAND-IN, for the edges real vLLM cannot be made
to hit on cue.

Real vLLM (tests/vllm/test_demo_pair.py) shows many requests in flight, streamed deltas that
add up, cancel = abort freeing the request, bad requests refused before vLLM, generate_many's
order. Kept here: a cancel before vLLM registered the request or while it waits for a slot, a
failing delta callback, close with requests in flight, metrics vLLM 0.32 always returns being
absent, and the batch-size schedule (GPU, EAGLE-family in vLLM's docs). The stand-in's
``hold`` event pauses its steps so a test can stage these without timing assumptions.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from generation import SamplingParams
from generation.interface import Cancelled
from generation.vllm_engine import SpecMetricsMissingError
from tests.generation.vllm_standin import PROMPT, WAIT, wait_until

pytestmark = pytest.mark.models


def _held(standin_vllm: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the stand-in's steps until the returned event is set."""
    hold = threading.Event()
    monkeypatch.setattr(standin_vllm, "hold", hold)
    return hold


def test_a_cancel_before_vllm_knew_the_request_aborts_at_its_first_output(
    engine_factory: Any, standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_factory("draft_model", 4)
    llm, admit = standin_vllm.instances[-1], threading.Event()
    monkeypatch.setattr(standin_vllm, "admit", admit)  # generate() is still adding the request
    handle = engine.start_loop(4).submit(PROMPT, SamplingParams(max_new_tokens=60))
    wait_until(lambda: handle.registered, "the request handed to vLLM's generate()")
    handle.cancel()
    wait_until(lambda: handle.cancel_requested, "the cancel on the loop's thread")
    assert not llm.aborted  # abort found nothing: vLLM did not know the request yet
    admit.set()
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    assert llm.aborted == [handle.request_id] and not llm.requests
    assert 0 < sum(len(burst) for burst in handle.deltas()) < 60


def test_a_failing_delta_callback_fails_its_request_and_aborts_it_in_vllm(
    engine_factory: Any, standin_vllm: Any
) -> None:
    engine = engine_factory("draft_model", 4)

    def broken(token_ids: list[int]) -> None:
        raise OSError("client socket gone")

    handle = engine.start_loop(4).submit(PROMPT, SamplingParams(max_new_tokens=60), broken)
    with pytest.raises(OSError, match="client socket gone"):
        handle.result(WAIT)
    llm = standin_vllm.instances[-1]
    wait_until(lambda: handle.request_id in llm.aborted, "the abort in vLLM")
    assert not llm.requests


def test_cancel_while_waiting_for_a_slot_never_reaches_vllm(
    engine_factory: Any, standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_factory("draft_model", 4)
    llm, hold = standin_vllm.instances[-1], _held(standin_vllm, monkeypatch)
    loop = engine.start_loop(1)
    first = loop.submit(PROMPT, SamplingParams(max_new_tokens=8))
    waiting = loop.submit(PROMPT, SamplingParams(max_new_tokens=8))
    wait_until(lambda: len(llm.seen) == 1, "the first request in vLLM")
    waiting.cancel()
    with pytest.raises(Cancelled):
        waiting.result(WAIT)  # at once: it held no slot in vLLM
    hold.set()
    assert len(first.result(WAIT).token_ids) == 8
    assert waiting.request_id not in llm.seen


def test_close_aborts_in_flight_requests_and_refuses_new_ones(
    engine_factory: Any, standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_factory("draft_model", 4)
    llm, hold = standin_vllm.instances[-1], _held(standin_vllm, monkeypatch)
    loop = engine.start_loop(4)
    handles = [loop.submit(PROMPT, SamplingParams(max_new_tokens=50)) for _ in range(3)]
    wait_until(lambda: len(llm.requests) == 3, "3 requests in vLLM")
    loop.close()
    for handle in handles:
        with pytest.raises(Cancelled):
            handle.result(WAIT)
    assert loop.closed
    with pytest.raises(Cancelled, match="closed"):
        loop.submit(PROMPT, SamplingParams()).result(WAIT)
    hold.set()
    assert sorted(llm.aborted) == sorted(h.request_id for h in handles)
    assert len(engine.generate(PROMPT, SamplingParams(max_new_tokens=5)).token_ids) == 5
    thread = engine._runner._thread
    engine.close()
    assert not thread.is_alive()  # the engine's event-loop thread is gone


def test_a_concurrency_the_engine_cannot_hold_is_refused(engine_factory: Any) -> None:
    assert engine_factory("draft_model", 4).start_loop().max_batch_size == 32  # the default
    engine = engine_factory("draft_model", 4, max_num_seqs=8)
    assert engine.start_loop(8).max_batch_size == 8
    for bad in (9, 0, True, "4"):
        with pytest.raises(ValueError, match="max_batch_size"):
            engine.start_loop(bad)


def test_missing_metrics_raise_where_drafts_were_certain_and_warn_elsewhere(
    engine_factory: Any,
    standin_vllm: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = engine_factory("draft_model", 4)
    monkeypatch.setattr(standin_vllm, "drop_metrics", True)
    with pytest.raises(SpecMetricsMissingError, match="refusing to record zero drafts"):
        engine.generate(PROMPT, SamplingParams(max_new_tokens=20))
    with caplog.at_level(logging.WARNING, logger="generation.vllm_engine.mapping"):
        short = engine.generate(PROMPT, SamplingParams(max_new_tokens=4))  # <= k + 1 tokens
    assert short.stats.num_drafts == 0 and "no spec-decode metrics" in caplog.text
    # An n-gram request that never matched honestly has no metrics: no error, a warning.
    ngram = engine_factory("ngram", 2)
    monkeypatch.setattr(standin_vllm, "drop_metrics", False)
    monkeypatch.setattr(standin_vllm.instances[-1], "_propose", lambda ctx: [])
    params = SamplingParams(max_new_tokens=10, method="ngram", num_speculative_tokens=2)
    stats = ngram.generate(PROMPT, params).stats
    assert stats.num_drafts == 0 and stats.num_target_forwards == 9


def test_auto_with_a_schedule_reports_the_k_vllm_chose(engine_factory: Any) -> None:
    engine = engine_factory("draft_model", "auto", auto_batch_schedule=[(1, 8, 4), (9, 64, 2)])
    stats = engine.generate(
        PROMPT, SamplingParams(max_new_tokens=30, num_speculative_tokens="auto")
    ).stats
    assert stats.num_speculative_tokens == "auto"
    assert stats.mean_chosen_k == pytest.approx(stats.num_draft_tokens / stats.num_target_forwards)


def test_generate_many_keeps_input_order_and_names_bad_requests(engine_factory: Any) -> None:
    from generation import BatchRequestError

    engine = engine_factory("draft_model", 4)
    prompts = [PROMPT, PROMPT[:4], [], PROMPT[2:]]
    params = [SamplingParams(max_new_tokens=n) for n in (5, 9, 3, 7)]
    with pytest.raises(BatchRequestError, match="request 2: prompt_token_ids: empty") as info:
        engine.generate_many(prompts, params)
    good = [r for r in info.value.results if r is not None]
    assert [len(r.token_ids) for r in good] == [5, 9, 7] and info.value.results[2] is None
    ok = engine.generate_many([PROMPT, PROMPT[:4]], SamplingParams(max_new_tokens=6))
    assert [r.token_ids for r in ok] == [
        engine.generate(p, SamplingParams(max_new_tokens=6)).token_ids for p in (PROMPT, PROMPT[:4])
    ]
