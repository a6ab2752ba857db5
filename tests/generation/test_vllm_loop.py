"""The vLLM engine's online loop against the vLLM STAND-IN: many requests in flight, streamed
deltas, cancellation by ``AsyncLLM.abort``, per-request metrics under batching.

vLLM cannot run on these machines (no GPU), so ``tests/generation/vllm_standin.py`` plays
vllm==0.32.0's ``AsyncLLM`` (documented shapes, continuous batching, abort); see its docstring
for what that does and does not show. The stand-in's ``hold`` event pauses its steps so a test
can put many requests in flight before the first step, without timing assumptions.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from generation import SamplingParams
from generation.base import Cancelled
from generation.vllm_engine import SpecMetricsMissingError, UnsupportedSpeculationError
from tests.generation.vllm_standin import PROMPT, WAIT, wait_until


def _held(standin_vllm: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the stand-in's steps until the returned event is set."""
    hold = threading.Event()
    monkeypatch.setattr(standin_vllm, "hold", hold)
    return hold


def test_many_requests_in_flight_each_get_their_own_exact_result(
    engine_factory: Any, standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_factory("draft_model", 4)
    prompts = [[(7 * i + j) % 90 + 1 for j in range(5 + i % 4)] for i in range(16)]
    params = [SamplingParams(max_new_tokens=10 + 3 * (i % 5)) for i in range(16)]
    alone = [engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)]
    llm, hold = standin_vllm.instances[-1], _held(standin_vllm, monkeypatch)
    loop = engine.start_loop(16)
    handles = [loop.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
    wait_until(lambda: len(llm.requests) == 16, "16 requests in vLLM")
    hold.set()
    results = [h.result(WAIT) for h in handles]
    assert max(llm.batch_sizes) == 16  # one batch, not one request at a time
    for together, solo in zip(results, alone, strict=True):
        assert together.token_ids == solo.token_ids
        batched, single = together.stats.to_dict(), solo.stats.to_dict()
        assert batched.pop("mean_batch_size") > 1.0 and single.pop("mean_batch_size") == 1.0
        assert batched == single  # per-request metrics: exact under batching
    assert sum(r.stats.num_drafts for r in results) > 0


def test_generate_is_safe_from_many_threads(engine_factory: Any, standin_vllm: Any) -> None:
    engine = engine_factory("ngram", 3)
    params = SamplingParams(max_new_tokens=24, method="ngram", num_speculative_tokens=3)
    expected = engine.generate(PROMPT, params).token_ids
    results: list[list[int]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(engine.generate(PROMPT, params).token_ids), daemon=True
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert results == [expected] * 8


def test_deltas_stream_the_verified_tokens_in_order(engine_factory: Any) -> None:
    engine = engine_factory("draft_model", 4)
    loop = engine.start_loop(4)
    seen: list[list[int]] = []
    handle = loop.submit(PROMPT, SamplingParams(max_new_tokens=30), on_delta=seen.append)
    result = handle.result(WAIT)
    streamed = list(handle.deltas())  # ends: the request finished
    assert handle.done and streamed == seen
    assert [t for burst in streamed for t in burst] == result.token_ids
    assert len(streamed) < len(result.token_ids)  # accepted drafts arrive as one burst


def test_cancel_aborts_the_request_in_vllm_and_spares_the_others(
    engine_factory: Any, standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_factory("draft_model", 4)
    full = engine.generate(PROMPT, SamplingParams(max_new_tokens=60)).token_ids
    llm, loop = standin_vllm.instances[-1], engine.start_loop(8)
    hold = _held(standin_vllm, monkeypatch)  # no output before the callback knows its handle
    victim: list[Any] = []
    handle = loop.submit(
        PROMPT, SamplingParams(max_new_tokens=60), on_delta=lambda ids: victim[0].cancel()
    )
    victim.append(handle)
    other = loop.submit(PROMPT, SamplingParams(max_new_tokens=60))
    hold.set()
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    assert handle.request_id in llm.aborted
    streamed = [t for burst in handle.deltas() for t in burst]
    assert 0 < len(streamed) < len(full) and streamed == full[: len(streamed)]
    assert other.result(WAIT).token_ids == full
    assert not llm.requests  # nothing left behind in vLLM's batch


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


def test_a_bad_request_fails_its_own_handle_only(engine_factory: Any) -> None:
    engine = engine_factory("draft_model", 4)
    loop = engine.start_loop(4)
    bad = loop.submit(PROMPT, SamplingParams(method="ngram"))
    good = loop.submit(PROMPT, SamplingParams(max_new_tokens=6))
    with pytest.raises(UnsupportedSpeculationError):
        bad.result(WAIT)
    assert bad.done and list(bad.deltas()) == []
    assert len(good.result(WAIT).token_ids) == 6


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
    from generation.engine_loop import BatchRequestError

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
