"""The serial fallback loop: requests in order, deltas, cancel before start, errors per request."""

from __future__ import annotations

import threading

import pytest

from generation.base import Cancelled, GenerationResult
from generation.params import SamplingParams
from generation.serial_loop import SerialLoop, loop_for
from generation.stats import GenerationStats


class Engine:
    """Echoes the prompt reversed; blocks on ``gate`` so a test can hold a request mid-generate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.calls: list[list[int]] = []

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        self.calls.append(list(prompt_token_ids))
        self.started.set()
        assert self.gate.wait(10)
        if prompt_token_ids == [0]:
            raise ValueError("prompt_token_ids: 0 is not allowed here")
        return GenerationResult(list(reversed(prompt_token_ids)), GenerationStats())


def test_requests_are_answered_in_order_with_their_deltas() -> None:
    engine = Engine()
    loop = SerialLoop(engine)
    seen: list[list[int]] = []
    try:
        handles = [loop.submit([i, i + 1], SamplingParams(), on_delta=seen.append) for i in (1, 5)]
        assert [h.result(10).token_ids for h in handles] == [[2, 1], [6, 5]]
        assert [list(h.deltas()) for h in handles] == [[[2, 1]], [[6, 5]]]
        assert seen == [[2, 1], [6, 5]] and all(h.done for h in handles)
    finally:
        loop.close()


def test_a_request_error_fails_only_that_request() -> None:
    loop = SerialLoop(Engine())
    try:
        bad, good = loop.submit([0], SamplingParams()), loop.submit([3], SamplingParams())
        with pytest.raises(ValueError, match="prompt_token_ids"):
            bad.result(10)
        assert good.result(10).token_ids == [3]
    finally:
        loop.close()


def test_cancel_before_start_frees_the_request_and_running_ones_finish() -> None:
    engine = Engine()
    engine.gate.clear()
    loop = SerialLoop(engine)
    try:
        running = loop.submit([1, 2], SamplingParams())
        assert engine.started.wait(10)
        waiting = loop.submit([7, 8], SamplingParams())
        waiting.cancel()
        running.cancel()  # already generating: it finishes and keeps its result
        with pytest.raises(TimeoutError):
            running.result(timeout=0.05)
        engine.gate.set()
        assert running.result(10).token_ids == [2, 1]
        with pytest.raises(Cancelled):
            waiting.result(10)
        assert list(waiting.deltas()) == []
        assert engine.calls == [[1, 2]], "a cancelled request never reaches the engine"
    finally:
        loop.close()


def test_close_cancels_what_waits_and_refuses_new_requests() -> None:
    engine = Engine()
    engine.gate.clear()
    loop = SerialLoop(engine)
    running = loop.submit([1], SamplingParams())
    assert engine.started.wait(10)
    queued = loop.submit([2], SamplingParams())
    threading.Timer(0.1, engine.gate.set).start()
    loop.close()
    assert running.result(10).token_ids == [1]
    with pytest.raises(Cancelled):
        queued.result(10)
    with pytest.raises(Cancelled):
        loop.submit([3], SamplingParams()).result(10)


def test_loop_for_prefers_the_engines_own_loop() -> None:
    class WithLoop(Engine):
        def start_loop(self, max_batch_size: int) -> str:
            return f"own loop of {max_batch_size}"

    assert loop_for(WithLoop(), 6) == "own loop of 6"  # type: ignore[comparison-overlap]
    fallback = loop_for(Engine(), 6)
    assert isinstance(fallback, SerialLoop)
    fallback.close()
