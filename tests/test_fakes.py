"""The fakes of the fast tests honour the protocols they stand in for (tests/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from generation import GenerationLoop, SamplingParams
from tests.fakes import FakeEngine
from tests.generation.conformance import check_engine_protocol, check_protocol


def test_the_fake_engine_names_the_whole_engine_protocol() -> None:
    engine = FakeEngine()
    check_engine_protocol(engine)
    check_protocol(engine.start_loop(), GenerationLoop)


def test_the_protocol_check_fails_on_a_missing_or_misnamed_member() -> None:
    class NoLoop(FakeEngine):
        start_loop = None  # type: ignore[assignment]

    class OtherParams(FakeEngine):
        def check_request(self, prompt: list[int], params: Any) -> None:  # type: ignore[override]
            """A parameter renamed against the protocol."""

    for broken in (NoLoop(), OtherParams()):
        with pytest.raises(AssertionError):
            check_engine_protocol(broken)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty"), ([1, 1000], "outside the vocabulary"), ([1] * 512, "context")],
)
def test_check_request_refuses_what_every_engine_refuses(prompt: list[int], message: str) -> None:
    engine = FakeEngine()
    with pytest.raises(ValueError, match=message):
        engine.check_request(prompt, SamplingParams())
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt, SamplingParams())
    assert engine.calls == []


def test_generate_many_answers_in_input_order_and_names_a_bad_request() -> None:
    engine = FakeEngine()
    params = [SamplingParams(max_new_tokens=2), SamplingParams(max_new_tokens=3)]
    results = engine.generate_many([[5, 6, 7, 8], [9, 10, 11, 12]], params, max_batch_size=2)
    assert [r.token_ids for r in results] == [[5, 6], [9, 10, 11]]
    assert [r.stats.num_output_tokens for r in results] == [2, 3]
    one = engine.generate_many([[1, 2], [3, 4]], SamplingParams(max_new_tokens=1))
    assert [r.token_ids for r in one] == [[1], [3]]
    with pytest.raises(ValueError, match=r"prompts\[1\]: .*empty"):
        engine.generate_many([[1], []], SamplingParams())
    with pytest.raises(ValueError, match="params: 1 given for 2 prompts"):
        engine.generate_many([[1], [2]], [SamplingParams()])


def test_the_fake_loop_streams_deltas_and_fails_only_the_bad_request() -> None:
    engine = FakeEngine()
    loop: GenerationLoop = engine.start_loop(max_batch_size=4)  # the protocol the worker uses
    seen: list[list[int]] = []
    handle = loop.submit([4, 5, 6], SamplingParams(max_new_tokens=2), on_delta=seen.append)
    assert handle.done and handle.result(timeout=1).token_ids == [4, 5]
    assert seen == [[4], [5]] and list(handle.deltas()) == [[4], [5]]
    loop.submit([7, 8], SamplingParams(max_new_tokens=1), background=True)
    assert loop.background == [False, True]  # type: ignore[attr-defined]
    bad = loop.submit([], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        bad.result(timeout=1)
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        loop.submit([1], SamplingParams())
