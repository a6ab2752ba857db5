"""EngineLoop: requests join a running batch, stream their tokens, leave, and can be cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.engine.loop import EngineLoop
from generation.interface import Cancelled, GenerationLoop
from tests.generation.batch_support import References, check_greedy, mixed_requests
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

VOCAB = 96
WAIT = 120.0  # seconds; every wait in these tests is bounded


@pytest.fixture(scope="module")
def engine() -> SpeculativeEngine:
    target = build_model("llama", vocab_size=VOCAB, seed=12, logit_scale=3.0)
    return SpeculativeEngine(
        target, perturbed_copy(target, noise=0.4), config=EngineConfig(max_speculative_tokens=4)
    )


@pytest.fixture
def loop(engine: SpeculativeEngine) -> Iterator[EngineLoop]:
    loop = engine.start_loop(max_batch_size=3)
    yield loop
    loop.close()


def test_is_a_generation_loop(loop: EngineLoop) -> None:
    assert isinstance(loop, EngineLoop)
    checked: GenerationLoop = loop  # the protocol the worker codes against
    assert checked is loop and loop.max_batch_size == 3


def test_requests_joining_mid_run_are_greedy_exact(
    engine: SpeculativeEngine, loop: EngineLoop
) -> None:
    prompts, params = mixed_requests(VOCAB, 9, 21, max_new=(8, 24))
    refs = References(engine.target)
    first_tokens = threading.Event()
    handles = [loop.submit(prompts[0], params[0], on_delta=lambda ids: first_tokens.set())]
    assert first_tokens.wait(WAIT)
    # The rest arrive while the first is decoding; with 3 slots most of them wait for one.
    handles += [loop.submit(p, sp) for p, sp in zip(prompts[1:], params[1:], strict=True)]
    for prompt, p, handle in zip(prompts, params, handles, strict=True):
        result = handle.result(timeout=WAIT)
        check_greedy(engine.target, prompt, result.token_ids, refs(prompt, p.max_new_tokens))
        assert handle.done


def test_deltas_add_up_to_the_result(loop: EngineLoop) -> None:
    bursts: list[list[int]] = []
    handle = loop.submit(
        [1, 2, 3, 1, 2, 3, 1, 2],
        SamplingParams(max_new_tokens=30, num_speculative_tokens=3),
        on_delta=bursts.append,
    )
    streamed = [t for burst in handle.deltas() for t in burst]
    result = handle.result(timeout=WAIT)
    assert streamed == result.token_ids == [t for burst in bursts for t in burst]
    # Verified bursts: a round can land several tokens at once.
    assert len(bursts) == result.stats.num_target_forwards + 1


def test_cancel_frees_the_slot(engine: SpeculativeEngine) -> None:
    loop = engine.start_loop(max_batch_size=1)
    try:
        started, gate = threading.Event(), threading.Event()

        def hold(ids: list[int]) -> None:  # the loop waits here until the test has cancelled
            started.set()
            gate.wait(WAIT)

        long = loop.submit([4, 5, 6], SamplingParams(max_new_tokens=200), on_delta=hold)
        assert started.wait(WAIT)
        waiting = loop.submit([7, 8, 9], SamplingParams(max_new_tokens=5))
        long.cancel()
        gate.set()
        with pytest.raises(Cancelled):
            long.result(timeout=WAIT)
        assert len([t for burst in long.deltas() for t in burst]) < 200
        # The only slot was freed: the waiting request runs and finishes.
        assert waiting.result(timeout=WAIT).token_ids == References(engine.target)([7, 8, 9], 5)
    finally:
        loop.close()


def test_bad_request_fails_its_own_handle(loop: EngineLoop) -> None:
    bad = loop.submit([], SamplingParams())
    good = loop.submit([1, 2, 3], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="prompt_token_ids: empty prompt"):
        bad.result(timeout=WAIT)
    assert bad.done and list(bad.deltas()) == []
    assert len(good.result(timeout=WAIT).token_ids) == 4


def test_a_failing_callback_stops_only_its_request(loop: EngineLoop) -> None:
    def broken(ids: list[int]) -> None:
        raise RuntimeError("client went away")

    failing = loop.submit([1, 2, 3], SamplingParams(max_new_tokens=50), on_delta=broken)
    fine = loop.submit([3, 2, 1], SamplingParams(max_new_tokens=6))
    with pytest.raises(RuntimeError, match="client went away"):  # the callback's own error
        failing.result(timeout=WAIT)
    assert len(fine.result(timeout=WAIT).token_ids) == 6


def test_close_cancels_what_is_in_flight(engine: SpeculativeEngine) -> None:
    loop = engine.start_loop(max_batch_size=2)
    started, gate = threading.Event(), threading.Event()

    def hold(ids: list[int]) -> None:  # the loop waits here until close() has begun
        started.set()
        gate.wait(WAIT)

    handles = [loop.submit([1, 2, 3], SamplingParams(max_new_tokens=200), on_delta=hold)]
    handles += [loop.submit([1, 2, 3], SamplingParams(max_new_tokens=200)) for _ in range(2)]
    assert started.wait(WAIT)
    closer = threading.Thread(target=loop.close)
    closer.start()
    deadline = time.monotonic() + WAIT
    while not loop.closed and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    for handle in handles:
        assert handle.done
        with pytest.raises(Cancelled):
            handle.result(timeout=0)
    late = loop.submit([1, 2], SamplingParams(max_new_tokens=2))
    with pytest.raises(Cancelled, match="closed"):
        late.result(timeout=0)


def test_result_times_out(loop: EngineLoop) -> None:
    gate = threading.Event()
    handle = loop.submit(
        [1, 2, 3], SamplingParams(max_new_tokens=300), on_delta=lambda ids: gate.wait(WAIT)
    )
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.05)
    handle.cancel()
    gate.set()
    with pytest.raises(Cancelled):
        handle.result(timeout=WAIT)


def _run_beside_background(
    engine: SpeculativeEngine, pause: bool
) -> tuple[list[str], list[int], list[int]]:
    """A background request decodes; a foreground one arrives. Returns the order in which the
    loop emitted their bursts ("b" / "f") and both requests' tokens."""
    # A long enough pause limit that the background request never steps in out of turn here.
    patient = SpeculativeEngine(
        engine.target,
        engine.draft,
        config=EngineConfig(
            max_speculative_tokens=4, pause_background=pause, max_background_pause=600
        ),
    )
    loop = patient.start_loop(max_batch_size=3)
    events: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def on_background(ids: list[int]) -> None:
        events.append("b")
        if not started.is_set():  # the loop waits here until the foreground request is queued
            started.set()
            gate.wait(WAIT)

    try:
        background = loop.submit(
            [4, 5, 6, 7],
            SamplingParams(max_new_tokens=60, num_speculative_tokens=2),
            on_delta=on_background,
            background=True,
        )
        assert started.wait(WAIT)
        foreground = loop.submit(
            [9, 8, 7],
            SamplingParams(max_new_tokens=12, num_speculative_tokens=2),
            on_delta=lambda ids: events.append("f"),
        )
        gate.set()
        return (
            events,
            background.result(timeout=WAIT).token_ids,
            foreground.result(timeout=WAIT).token_ids,
        )
    finally:
        loop.close()


def test_background_requests_sit_out_the_steps_of_a_foreground_one(
    engine: SpeculativeEngine,
) -> None:
    refs = References(engine.target)
    want_b, want_f = refs([4, 5, 6, 7], 60), refs([9, 8, 7], 12)
    assert len(want_b) == 60 and len(want_f) == 12  # no EOS: both run their whole budget
    events, got_b, got_f = _run_beside_background(engine, pause=True)
    first, last = events.index("f"), len(events) - 1 - events[::-1].index("f")
    # From the foreground's first token to its last, the background request took no step...
    assert "b" not in events[first:last], events
    assert events[-1] == "b"  # ...and then went on where it stopped,
    check_greedy(engine.target, [4, 5, 6, 7], got_b, want_b)  # its answer unchanged
    check_greedy(engine.target, [9, 8, 7], got_f, want_f)

    # Sharing the steps (a GPU's default), the same two requests interleave.
    events, got_b, got_f = _run_beside_background(engine, pause=False)
    first, last = events.index("f"), len(events) - 1 - events[::-1].index("f")
    assert "b" in events[first:last], events
    check_greedy(engine.target, [4, 5, 6, 7], got_b, want_b)


def test_foreground_requests_take_free_slots_before_background_ones(
    engine: SpeculativeEngine,
) -> None:
    sharing = SpeculativeEngine(
        engine.target, engine.draft, config=EngineConfig(pause_background=False)
    )
    loop = sharing.start_loop(max_batch_size=1)
    order: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def hold(ids: list[int]) -> None:
        if not started.is_set():
            started.set()
            gate.wait(WAIT)

    try:
        first = loop.submit([1, 2, 3], SamplingParams(max_new_tokens=4), on_delta=hold)
        assert started.wait(WAIT)
        params = SamplingParams(max_new_tokens=3)
        later = [
            loop.submit([2, 3], params, on_delta=lambda ids: order.append("b1"), background=True),
            loop.submit([3, 4], params, on_delta=lambda ids: order.append("f"), background=False),
            loop.submit([4, 5], params, on_delta=lambda ids: order.append("b2"), background=True),
        ]
        gate.set()
        for handle in [first, *later]:
            handle.result(timeout=WAIT)
        # One slot: the foreground request, queued second, ran first; background in arrival order.
        assert [o for i, o in enumerate(order) if i == 0 or order[i - 1] != o] == ["f", "b1", "b2"]
    finally:
        loop.close()
