"""Worker concurrency: defaults per engine, and refusal (with the reason) of what an engine cannot hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from app.serving import DEFAULT_CONCURRENCY, check_concurrency, worker_concurrency
from app.settings import Settings


@contextmanager
def worker_resources(
    tiny_models: dict[str, Path], tmp_path: Path, **settings: Any
) -> Iterator[Any]:
    """A worker's ``Resources`` over the tiny pair on CPU with two slots and these settings."""
    from app.db import prepare
    from app.resources import Resources

    full = Settings(
        data_dir=tmp_path, device="cpu", worker_concurrency=2,
        target_model=tiny_models["target"], draft_model=tiny_models["draft"], **settings,
    )  # fmt: skip
    db, session_factory = prepare(full)
    resources = Resources(full, session_factory)
    try:
        yield resources
    finally:
        resources.close()
        db.dispose()


def test_concurrency_defaults_per_engine_and_the_setting_wins() -> None:
    assert worker_concurrency(Settings(device="cpu")) == DEFAULT_CONCURRENCY["torch-cpu"]
    assert worker_concurrency(Settings(engine="vllm")) == DEFAULT_CONCURRENCY["vllm"]
    assert worker_concurrency(Settings(device="cpu", worker_concurrency=7)) == 7


def test_an_engine_is_refused_a_concurrency_it_cannot_hold(tiny_models: dict[str, Path]) -> None:
    from generation import EngineConfig, SpeculativeEngine

    engine = SpeculativeEngine.from_pretrained(
        tiny_models["target"], tiny_models["draft"], config=EngineConfig(max_batch_size=4)
    )
    assert engine.max_concurrency == 4 and engine.kv_bytes_per_slot > 0
    check_concurrency(engine, 4)  # the tiny pair holds a few easily
    with pytest.raises(ValueError, match="SPECRAG_WORKER_CONCURRENCY: must be >= 1"):
        check_concurrency(engine, 0)
    with pytest.raises(ValueError, match="holds at most 4"):
        check_concurrency(engine, 5)
    # The engine decides its slots from memory: a batch no memory holds gets fewer slots.
    huge = SpeculativeEngine(engine.target, engine.draft, config=EngineConfig(max_batch_size=10**9))
    assert 1 <= huge.max_concurrency < 10**9
    assert huge.max_concurrency * huge.kv_bytes_per_slot < 10**9 * engine.kv_bytes_per_slot
    with pytest.raises(ValueError, match=r"SPECRAG_WORKER_CONCURRENCY: .* holds at most"):
        check_concurrency(huge, 10**9)
    # Allocated once, at the size decided: every slot holds the full context and one round of
    # the widest draft (a fixed or "auto" k, or a suffix chain).
    store = engine.kv_stores[0]
    assert store.num_slots == 4
    widest = max(engine.max_speculative_tokens, engine.config.suffix_max_speculative_tokens)
    assert widest == 32  # the suffix chain's default is the wider
    assert store.capacity == engine.max_context + widest + 1


def test_an_engine_that_states_its_limit_is_held_to_it() -> None:
    class Limited:
        max_concurrency = 8

    check_concurrency(Limited(), 8)
    with pytest.raises(ValueError, match="holds at most 8"):
        check_concurrency(Limited(), 9)


def test_the_prefill_chunk_setting_reaches_the_torch_engine_loop(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from generation import SpeculativeEngine

    with worker_resources(tiny_models, tmp_path, prefill_chunk=96) as resources:
        loop = resources.loop  # what a worker starts: the torch engine's EngineLoop
        assert isinstance(resources.engine, SpeculativeEngine)
        assert loop._batch.scheduler.prefill_chunk == 96
        assert loop.max_batch_size == 2
    with pytest.raises(ValueError, match="prefill_chunk"):
        Settings(prefill_chunk=0)


def test_max_speculative_tokens_reaches_the_torch_engine(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """SPECRAG_MAX_SPECULATIVE_TOKENS=12 admits k = 12: a k = 12 row beside an "auto" row must be
    served (the engine's goodput table must price k + 1 = 13), not fail the step."""
    from generation import SamplingParams

    with worker_resources(tiny_models, tmp_path, max_speculative_tokens=12) as resources:
        engine = resources.engine
        ids = resources.tokenizer.encode("a b c d e f g h", add_special_tokens=False)
        params = [
            SamplingParams(max_new_tokens=40, num_speculative_tokens=12),
            SamplingParams(max_new_tokens=40, num_speculative_tokens="auto"),
        ]
        fixed, auto = engine.generate_many([ids, ids[:5]], params)
        assert fixed.stats.num_draft_tokens > 0 and len(fixed.token_ids) > 0
        assert len(fixed.stats.accepted_per_position) <= 12 and auto.token_ids


def test_the_prefix_cache_setting_reaches_the_engine_and_a_tiny_one_is_refused_at_start(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from generation import SamplingParams
    from generation.engine.block_index import PrefixCacheBudgetError

    # On by default (as vLLM's prefix caching is), bounded by the default 256 MB.
    with worker_resources(tiny_models, tmp_path) as resources:
        cache = resources.engine.prefix_cache
        assert cache is not None and 0 < cache.nbytes() <= 256 * 2**20
    with worker_resources(tiny_models, tmp_path, prefix_cache_mb=0) as resources:
        assert resources.engine.prefix_cache is None  # 0: off, the engine as without reuse
    with worker_resources(tiny_models, tmp_path, prefix_cache_mb=0.5) as resources:
        cache = resources.engine.prefix_cache
        assert cache is not None and cache.nbytes() <= 0.5 * 2**20
        prompt = list(range(5, 45))
        params = SamplingParams(max_new_tokens=3)
        first, again = (resources.engine.generate(prompt, params) for _ in range(2))
        assert first.stats.num_cached_prompt_tokens == 0
        assert again.stats.num_cached_prompt_tokens == 32 and again.token_ids == first.token_ids
    with worker_resources(tiny_models, tmp_path, prefix_cache_mb=0.000001) as resources:
        with pytest.raises(PrefixCacheBudgetError, match=r"SPECRAG_PREFIX_CACHE_MB: .* at least"):
            resources.engine  # noqa: B018 - what a worker loads at start
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Settings(prefix_cache_mb=-1)


@pytest.mark.parametrize("packed", [None, False])
def test_the_packed_weights_setting_reaches_both_models(
    tiny_models: dict[str, Path], tmp_path: Path, packed: bool | None
) -> None:
    import torch

    from generation.model.forward import can_pack

    with worker_resources(tiny_models, tmp_path, packed_weights=packed) as resources:
        engine = resources.engine
        want = packed is None and can_pack(torch.ones(1))  # unset: on for float32 on a CPU
        assert [engine.target_forward.packed, engine.draft_forward.packed] == [want, want]


def test_the_dtype_setting_reaches_the_engine_and_bf16_without_cpu_support_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from generation.model import dtypes

    with pytest.raises(ValueError, match="dtype"):
        Settings(dtype="float16")
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset())  # a CPU without bf16
    with worker_resources(tiny_models, tmp_path, dtype="auto") as resources:
        assert resources.engine.dtype == "float32"  # auto falls back
    with worker_resources(tiny_models, tmp_path, dtype="bfloat16") as resources:
        refusal = r"SPECRAG_DTYPE: dtype 'bfloat16': .*avx512_bf16.*SPECRAG_DTYPE=float32"
        with pytest.raises(ValueError, match=refusal):
            resources.engine  # noqa: B018 - what a worker loads at start
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset({"avx512_bf16"}))
    with worker_resources(tiny_models, tmp_path, dtype="auto") as resources:
        assert resources.engine.dtype == "bfloat16"
