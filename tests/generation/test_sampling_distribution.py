"""End to end: the engine's first tokens at temperature 1 follow the target's exact joint law.

A three-token vocabulary keeps the joint distribution of the first four tokens small (81
cells), so it is computed exactly from the target's logits and compared with the engine's
samples by a chi-square test. The draft differs from the target, so drafts are rejected,
recovered tokens and bonus tokens all occur, and caches roll back between rounds. Suffix rows
draft from the prompt and from a scope of past answers the target often disagrees with.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from generation import SamplingParams, SpeculativeEngine
from generation.spec_decode.eagle import EagleHeadModule, head_config
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

VOCAB = 3
NUM_TOKENS = 4
NUM_SAMPLES = 2000
PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]  # repeats, so prompt lookup always has a match


def exact_joint(model: Any, prompt: list[int], temperature: float) -> np.ndarray:
    """Return P(first NUM_TOKENS tokens = seq) for every seq, ordered as itertools.product."""
    probs = {(): 1.0}
    with torch.inference_mode():
        for length in range(NUM_TOKENS):
            prefixes = list(itertools.product(range(VOCAB), repeat=length))
            ids = torch.tensor([prompt + list(p) for p in prefixes])
            logits = model(input_ids=ids).logits[:, -1].double()  # [num_prefixes, vocab]
            next_probs = torch.softmax(logits / temperature, dim=-1).tolist()
            probs = {
                p + (t,): probs[p] * next_probs[i][t]
                for i, p in enumerate(prefixes)
                for t in range(VOCAB)
            }
    return np.array([probs[s] for s in itertools.product(range(VOCAB), repeat=NUM_TOKENS)])


def chi_square_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Return the chi-square p-value, pooling cells whose expected count is below 5."""
    expected = probs / probs.sum() * observed.sum()
    keep = expected >= 5
    f_obs = np.append(observed[keep], observed[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum())
    return float(chisquare(f_obs, f_exp).pvalue)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=str)
def engine(request: pytest.FixtureRequest) -> SpeculativeEngine:
    """The engine in float32 and in bfloat16 (weights, KV); its sampling is float32 in both."""
    # Sharpened logits: uneven distributions that target and draft disagree on.
    target = build_model("llama", vocab_size=VOCAB, seed=11, logit_scale=30.0)
    draft = perturbed_copy(target, noise=0.6)
    torch.manual_seed(12)
    head = EagleHeadModule(head_config(target.config))  # random: often rejected, sometimes not
    engine = SpeculativeEngine(
        target.to(request.param), draft.to(request.param), eagle=head.to(request.param)
    )
    # The draft costs what the target does, so goodput would rightly not draft for "auto";
    # priced as a cheap draft, "auto" drafts and its rounds are tested.
    engine.step_costs().timer = lambda batch_size, ks, with_draft: {k: 0.01 for k in ks}
    engine.step_costs().eagle_timer = lambda batch_size, ks: {k: 0.01 for k in ks}
    assert engine.suffix_memory is not None
    for i, answer in enumerate(([0, 1, 2, 2, 1, 0, 0, 2], [1, 2, 0, 1, 1, 2, 2, 0], [2, 0, 1, 0])):
        engine.suffix_memory.add("law", f"past-{i}", answer)
    return engine


@pytest.mark.parametrize(
    ("method", "k"),
    [
        ("draft_model", 2),
        ("ngram", 3),
        ("suffix", 3),
        ("suffix", "auto"),
        ("draft_model", "auto"),
        ("eagle", 2),
        ("eagle", "auto"),
    ],
)
def test_first_tokens_follow_the_target_joint_distribution(
    engine: SpeculativeEngine, method: str, k: int | str
) -> None:
    index = {s: i for i, s in enumerate(itertools.product(range(VOCAB), repeat=NUM_TOKENS))}
    observed = np.zeros(len(index))
    params = [
        SamplingParams(
            max_new_tokens=NUM_TOKENS,
            temperature=1.0,
            seed=seed,
            method=method,
            num_speculative_tokens=k,
            suffix_scope="law" if method == "suffix" else None,
        )
        for seed in range(NUM_SAMPLES)
    ]
    # One continuous batch of the engine's full width: rows accept different numbers of drafts
    # in the same pass and roll back on their own, as in a worker; a batch of one is the same
    # code (``generate`` is ``generate_many`` of one).
    results = engine.generate_many([PROMPT] * NUM_SAMPLES, params)
    assert max(r.stats.mean_batch_size for r in results) > 1
    for result in results:
        observed[index[tuple(result.token_ids)]] += 1
    drafted = sum(r.stats.num_draft_tokens for r in results)
    accepted = sum(r.stats.num_accepted_tokens for r in results)
    # Both outcomes of the acceptance test must have occurred often.
    assert 0.1 < accepted / drafted < 0.9, accepted / drafted
    target_joint = exact_joint(engine.target, PROMPT, temperature=1.0)
    assert chi_square_pvalue(observed, target_joint) > 1e-3
    # The test has power: a nearby wrong law (the target at temperature 1.3) is rejected.
    assert chi_square_pvalue(observed, exact_joint(engine.target, PROMPT, temperature=1.3)) < 1e-6
