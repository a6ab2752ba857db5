"""Sampling under batching: the first tokens' joint law, and seeded requests in any company.

Thousands of seeded requests go through ``generate_many`` at once (rows of every method share
target passes); their first tokens are compared with the target's exact joint law by a
chi-square test that also rejects a nearby wrong law (the target at temperature 1.3).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from generation import EngineConfig, SamplingParams, SpeculativeEngine
from tests.generation.test_sampling_distribution import (
    NUM_TOKENS,
    PROMPT,
    VOCAB,
    chi_square_pvalue,
    exact_joint,
)
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

NUM_SAMPLES = 2000


@pytest.fixture(scope="module")
def engine() -> SpeculativeEngine:
    target = build_model("llama", vocab_size=VOCAB, seed=11, logit_scale=30.0)
    return SpeculativeEngine(
        target, perturbed_copy(target, noise=0.6), config=EngineConfig(max_batch_size=64)
    )


def test_first_tokens_follow_the_target_joint_law_in_a_batch(engine: SpeculativeEngine) -> None:
    kinds = [("draft_model", 2), ("ngram", 3), ("draft_model", "auto"), ("none", 1)]
    params = [
        SamplingParams(
            max_new_tokens=NUM_TOKENS,
            temperature=1.0,
            seed=seed,
            method=kinds[seed % len(kinds)][0],
            num_speculative_tokens=kinds[seed % len(kinds)][1],
        )
        for seed in range(NUM_SAMPLES)
    ]
    results = engine.generate_many([PROMPT] * NUM_SAMPLES, params, max_batch_size=64)
    index = {s: i for i, s in enumerate(itertools.product(range(VOCAB), repeat=NUM_TOKENS))}
    observed = np.zeros(len(index))
    for result in results:
        observed[index[tuple(result.token_ids)]] += 1
    drafted = sum(r.stats.num_draft_tokens for r in results)
    accepted = sum(r.stats.num_accepted_tokens for r in results)
    assert 0.1 < accepted / drafted < 0.9, accepted / drafted
    assert min(r.stats.mean_batch_size for r in results) > 8
    assert chi_square_pvalue(observed, exact_joint(engine.target, PROMPT, 1.0)) > 1e-3
    # The test has power: a nearby wrong law is rejected.
    assert chi_square_pvalue(observed, exact_joint(engine.target, PROMPT, 1.3)) < 1e-6


@pytest.mark.parametrize(("method", "k"), [("draft_model", 3), ("ngram", 2), ("none", 1)])
def test_a_seeded_request_gets_its_tokens_in_any_company(
    engine: SpeculativeEngine, method: str, k: int
) -> None:
    params = SamplingParams(
        max_new_tokens=12, temperature=0.9, seed=5, method=method, num_speculative_tokens=k
    )
    alone = engine.generate(PROMPT, params).token_ids
    company = [
        SamplingParams(max_new_tokens=n, temperature=t, seed=s, num_speculative_tokens="auto")
        for n, t, s in [(3, 1.0, 1), (20, 0.0, None), (7, 0.7, None), (15, 1.2, 9)]
    ]
    prompts = [[0, 1, 2], [2, 2, 1, 0], PROMPT, [1] * 9]
    for position in range(len(company) + 1):
        batch = company[:position] + [params] + company[position:]
        batch_prompts = prompts[:position] + [PROMPT] + prompts[position:]
        results = engine.generate_many(batch_prompts, batch, max_batch_size=3)
        assert results[position].token_ids == alone, position
