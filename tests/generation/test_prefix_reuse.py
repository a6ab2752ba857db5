"""Exact prefix reuse in the torch engine: same answers, same law, bounded memory, off = as before.

Tiny random Llama-family pairs (tests/generation/tiny_models.py) with a 4-token block, so short
prompts share whole blocks. The reference is the target alone (transformers' greedy generate)
and an engine without reuse; sampling is checked by a chi-square test against the target's exact
joint law, with every request after the first reusing its prompt's head.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.engine.block_index import PrefixCacheBudgetError
from tests.generation.conformance import EngineConformance, make_prompts
from tests.generation.test_sampling_distribution import (
    NUM_TOKENS,
    chi_square_pvalue,
    exact_joint,
)
from tests.generation.tiny_models import build_model, perturbed_copy, reference_greedy

pytestmark = pytest.mark.models

BLOCK = 4
MB = 1 << 20


def _engine(target: Any, draft: Any, mb: float, **kw: Any) -> SpeculativeEngine:
    config = EngineConfig(prefix_cache_mb=mb, prefix_block_size=BLOCK, **kw)
    return SpeculativeEngine(target, draft, config=config)


@pytest.fixture(scope="module")
def small_pair() -> tuple[Any, Any]:
    target = build_model("llama", vocab_size=64, seed=3)
    return target, perturbed_copy(target, noise=0.05)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """RAG-shaped: one of three 'passages' (12 tokens) first, then a short 'question'."""
    rng = random.Random(seed)
    passages = [[rng.randrange(64) for _ in range(12)] for _ in range(3)]
    return [
        passages[rng.randrange(3)] + [rng.randrange(64) for _ in range(rng.randrange(1, 6))]
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    ("method", "k"), [("draft_model", 3), ("ngram", 2), ("suffix", 4), ("none", 1)]
)
def test_greedy_answers_are_the_target_alone_and_reuse_is_counted(
    small_pair: tuple[Any, Any], method: str, k: int
) -> None:
    target, draft = small_pair
    on, off = _engine(target, draft, 1.0), _engine(target, draft, 0.0)
    params = SamplingParams(max_new_tokens=12, method=method, num_speculative_tokens=k)
    prompts = _prompts(12)
    for i, prompt in enumerate(prompts):
        got, base = on.generate(prompt, params), off.generate(prompt, params)
        assert got.token_ids == base.token_ids == reference_greedy(target, prompt, 12)
        cached = got.stats.num_cached_prompt_tokens
        assert base.stats.num_cached_prompt_tokens == 0
        assert cached % BLOCK == 0 and cached <= len(prompt) - 1
        if any(p[:12] == prompt[:12] for p in prompts[:i]):
            assert cached >= 12, (i, cached)  # the shared passage came from the cache
        a, b = got.stats.to_dict(), base.stats.to_dict()
        for name in ("ttft_ms", "generation_ms", "num_cached_prompt_tokens"):
            a.pop(name), b.pop(name)
        assert a == b  # every other stat unchanged
    # Batched, both kinds of rows together: still the target's answers.
    batch = on.generate_many(prompts, params)
    assert [r.token_ids for r in batch] == [reference_greedy(target, p, 12) for p in prompts]
    assert all(r.stats.num_cached_prompt_tokens >= 12 for r in batch)


def test_requests_salted_apart_never_share_cached_kv(small_pair: tuple[Any, Any]) -> None:
    """vLLM's ``cache_salt``: the service salts with the tenant, so one tenant's prompts never
    speed up (or time) another's; the same salt, or none, shares as before."""
    target, draft = small_pair
    engine = _engine(target, draft, 1.0)
    prompt = _prompts(1)[0]

    def cached(salt: str | None) -> int:
        params = SamplingParams(max_new_tokens=4, num_speculative_tokens=2, cache_salt=salt)
        result = engine.generate(prompt, params)
        assert result.token_ids == reference_greedy(target, prompt, 4)
        return result.stats.num_cached_prompt_tokens

    assert cached("tenant-1") == 0
    assert cached("tenant-2") == 0  # same tokens, another tenant: computed afresh
    assert cached(None) == 0  # unsalted requests have a root of their own
    assert cached("tenant-1") == cached("tenant-2") == cached(None) == 12
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="")


def test_sampling_follows_the_target_law_with_a_reused_prefix() -> None:
    target = build_model("llama", vocab_size=3, seed=11, logit_scale=30.0)
    draft = perturbed_copy(target, noise=0.6)
    engine = _engine(target, draft, 1.0)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 0, 2, 1]  # 3 full blocks reused, 1 token computed
    index = {s: i for i, s in enumerate(itertools.product(range(3), repeat=NUM_TOKENS))}
    observed = np.zeros(len(index))
    params = [
        SamplingParams(
            max_new_tokens=NUM_TOKENS, temperature=1.0, seed=seed, num_speculative_tokens=2
        )
        for seed in range(1500)
    ]
    # The first request fills the cache; the rest reuse it, one continuous batch.
    results = [engine.generate(prompt, params[0])]
    assert results[0].stats.num_cached_prompt_tokens == 0
    results += engine.generate_many([prompt] * (len(params) - 1), params[1:])
    for result in results[1:]:
        assert result.stats.num_cached_prompt_tokens == 12
    for result in results:
        observed[index[tuple(result.token_ids)]] += 1
    assert chi_square_pvalue(observed, exact_joint(target, prompt, 1.0)) > 1e-3
    assert chi_square_pvalue(observed, exact_joint(target, prompt, 1.3)) < 1e-6  # has power


def test_memory_stays_under_the_setting_over_a_long_soak(small_pair: tuple[Any, Any]) -> None:
    target, draft = small_pair
    engine = _engine(target, draft, 0.05)
    cache = engine.prefix_cache
    assert cache is not None and cache.nbytes() <= 0.05 * MB
    params = SamplingParams(max_new_tokens=4, method="draft_model", num_speculative_tokens=2)
    rng = random.Random(1)
    reused = 0
    for _ in range(30):
        prompts = [[rng.randrange(64) for _ in range(rng.randrange(5, 40))] for _ in range(8)]
        prompts += _prompts(8)  # recurring passages, between the random prompts
        for r in engine.generate_many(prompts, params):
            reused += r.stats.num_cached_prompt_tokens
        assert cache.nbytes() <= 0.05 * MB
        assert cache.index.num_cached <= cache.index.num_blocks
        assert cache.index.num_referenced == 0
    # It filled, evicted, and still reused the recurring passages.
    assert cache.index.num_cached == cache.index.num_blocks and cache.index.evictions > 0
    assert reused > 0


def test_reuse_off_is_the_default_and_a_budget_below_one_block_is_refused(
    small_pair: tuple[Any, Any],
) -> None:
    target, draft = small_pair
    assert SpeculativeEngine(target, draft).prefix_cache is None
    with pytest.raises(PrefixCacheBudgetError, match=r"SPECRAG_PREFIX_CACHE_MB.*at least 1 MB"):
        _engine(target, draft, 0.0001)


# -- the whole engine contract with reuse on ---------------------------------------------------
CONFORMANCE_VOCAB = 96


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def engine(request: pytest.FixtureRequest) -> SpeculativeEngine:
    """Both forward paths (the fast Llama one, transformers' for GPT-2), reuse on."""
    target = build_model(request.param, vocab_size=CONFORMANCE_VOCAB, seed=3, logit_scale=4.0)
    return _engine(target, perturbed_copy(target, noise=0.3), 1.0, max_speculative_tokens=6)


@pytest.fixture(scope="module")
def reference(engine: SpeculativeEngine) -> Any:
    return lambda prompt, n: reference_greedy(engine.target, prompt, n)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(CONFORMANCE_VOCAB, range(3))


class TestConformanceWithPrefixReuse(EngineConformance):
    """Every engine rule holds while requests reuse each other's prompt prefixes."""
