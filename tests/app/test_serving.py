"""Worker concurrency: defaults per engine, and refusal (with the reason) of what an engine cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.resources import loop_options
from app.serving import (
    DEFAULT_CONCURRENCY,
    check_concurrency,
    kv_bytes_per_query,
    worker_concurrency,
)
from app.settings import Settings


def test_concurrency_defaults_per_engine_and_the_setting_wins() -> None:
    assert worker_concurrency(Settings(device="cpu")) == DEFAULT_CONCURRENCY["torch-cpu"]
    assert worker_concurrency(Settings(engine="vllm")) == DEFAULT_CONCURRENCY["vllm"]
    assert worker_concurrency(Settings(device="cpu", worker_concurrency=7)) == 7


def test_an_engine_is_refused_a_concurrency_it_cannot_hold(tiny_models: dict[str, Path]) -> None:
    from generation import SpeculativeEngine

    engine = SpeculativeEngine.from_pretrained(tiny_models["target"], tiny_models["draft"])
    per_query = kv_bytes_per_query(engine)
    assert per_query > 0
    check_concurrency(engine, 4)  # the tiny pair holds a few easily
    with pytest.raises(ValueError, match="SPECRAG_WORKER_CONCURRENCY: must be >= 1"):
        check_concurrency(engine, 0)
    with pytest.raises(ValueError, match=r"SPECRAG_WORKER_CONCURRENCY: .* MiB of KV cache"):
        check_concurrency(engine, 10**9)


def test_an_engine_that_states_its_limit_is_held_to_it() -> None:
    class Limited:
        max_concurrency = 8

    check_concurrency(Limited(), 8)
    with pytest.raises(ValueError, match="holds at most 8"):
        check_concurrency(Limited(), 9)


def test_the_prefill_chunk_setting_reaches_the_torch_engine_loop(
    tiny_models: dict[str, Path],
) -> None:
    from generation import SpeculativeEngine
    from tests.fakes import FakeEngine

    settings = Settings(device="cpu", prefill_chunk=96)
    engine = SpeculativeEngine.from_pretrained(tiny_models["target"], tiny_models["draft"])
    options = loop_options(engine.start_loop, settings)
    assert options == {"prefill_chunk": 96}
    loop = engine.start_loop(2, **options)
    try:
        assert loop._batch.scheduler.prefill_chunk == 96
    finally:
        loop.close()
    assert loop_options(FakeEngine().start_loop, settings) == {}  # an engine without the knob
    with pytest.raises(ValueError, match="prefill_chunk"):
        Settings(prefill_chunk=0)
