"""The rejection sampler's output follows the target distribution (statistical tests)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from generation.rejection_sampler import greedy_verify, rejection_sample

VOCAB = 30


def random_distributions(rows: int, generator: torch.Generator) -> torch.Tensor:
    """Return [rows, VOCAB] probability rows with uneven mass (so rejections happen)."""
    logits = torch.randn(rows, VOCAB, generator=generator) * 2.0
    return torch.softmax(logits, dim=-1)


def first_token_histogram(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, num_samples: int, seed: int
) -> torch.Tensor:
    """Return the empirical distribution [VOCAB] of the first output token of many rounds."""
    generator = torch.Generator().manual_seed(seed)
    k = target_probs.shape[0] - 1
    counts = torch.zeros(VOCAB)
    for _ in range(num_samples):
        if draft_probs is None:  # one-hot proposer: a fixed guess per position
            draft_tokens = torch.tensor([3] * k)
        else:
            draft_tokens = torch.multinomial(draft_probs, 1, generator=generator).view(k)
        num_accepted, next_token = rejection_sample(
            target_probs, draft_probs, draft_tokens, generator
        )
        first = draft_tokens[0] if num_accepted.item() > 0 else next_token[0]
        counts[first] += 1
    return counts / num_samples


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_approximates_target_distribution(one_hot: bool) -> None:
    """As in vLLM: the error toward the target shrinks far faster than toward random references."""
    generator = torch.Generator().manual_seed(0)
    k = 2
    target_probs = random_distributions(k + 1, generator)
    draft_probs = None if one_hot else random_distributions(k, generator)
    reference = random_distributions(1, generator)[0]
    to_target, to_reference = [], []
    for num_samples in (10, 100, 1000, 10000):
        estimate = first_token_histogram(target_probs, draft_probs, num_samples, seed=num_samples)
        to_target.append(torch.dist(target_probs[0], estimate).item())
        to_reference.append(torch.dist(reference, estimate).item())
    improvement_target = to_target[0] / to_target[-1]
    improvement_reference = to_reference[0] / to_reference[-1]
    # Monte Carlo error falls like 1/sqrt(n): ~30x over 10 -> 10000 samples; toward a wrong
    # distribution it stalls at the true distance.
    assert improvement_target > 10 * improvement_reference, (to_target, to_reference)


@pytest.mark.parametrize("one_hot", [False, True])
def test_every_position_follows_its_target_row(one_hot: bool) -> None:
    """Chi-square per position: given the round reached position j, its token ~ target row j."""
    generator = torch.Generator().manual_seed(1)
    k = 3
    target_probs = random_distributions(k + 1, generator)
    draft_probs = None if one_hot else random_distributions(k, generator)
    # Drafts close to the target at position 0 make later positions reachable often enough.
    if draft_probs is not None:
        draft_probs = 0.5 * draft_probs + 0.5 * target_probs[:k]
    counts = torch.zeros(k + 1, VOCAB)
    for _ in range(6000):
        if draft_probs is None:
            draft_tokens = target_probs[:k].argmax(dim=-1)
        else:
            draft_tokens = torch.multinomial(draft_probs, 1, generator=generator).view(k)
        num_accepted, next_token = rejection_sample(
            target_probs, draft_probs, draft_tokens, generator
        )
        emitted = [*draft_tokens[: int(num_accepted)].tolist(), int(next_token)]
        for position, token in enumerate(emitted):
            counts[position, token] += 1
    for position in range(k + 1):
        observed = counts[position]
        if observed.sum() < 500:
            continue
        expected = target_probs[position] * observed.sum()
        keep = expected >= 5  # chi-square needs expected counts >= 5; pool the rest
        f_obs = torch.cat([observed[keep], observed[~keep].sum().view(1)])
        f_exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
        assert chisquare(f_obs.numpy(), f_exp.numpy()).pvalue > 1e-3, position
    assert counts[1].sum() >= 500, "too few rounds reached position 1 to test it"


def test_identical_distributions_accept_everything() -> None:
    generator = torch.Generator().manual_seed(2)
    probs = random_distributions(5, generator)
    for _ in range(200):
        draft_tokens = torch.multinomial(probs[:4], 1, generator=generator).view(4)
        num_accepted, _ = rejection_sample(probs, probs[:4], draft_tokens, generator)
        assert int(num_accepted) == 4


def test_zero_target_probability_is_always_rejected() -> None:
    target = torch.zeros(2, VOCAB)
    target[:, 5] = 1.0
    num_accepted, next_token = rejection_sample(target, None, torch.tensor([4]), None)
    assert int(num_accepted) == 0 and int(next_token) == 5


def test_greedy_verify_stops_at_first_mismatch_and_breaks_ties_low() -> None:
    logits = torch.zeros(4, VOCAB)  # [k + 1, vocab]
    logits[0, 7] = logits[1, 8] = 1.0
    logits[2, 9] = logits[2, 2] = 1.0  # a tie: argmax takes the lowest id, 2
    num_accepted, next_token = greedy_verify(logits, torch.tensor([7, 8, 9]))
    assert int(num_accepted) == 2 and int(next_token) == 2
    num_accepted, next_token = greedy_verify(logits, torch.tensor([7, 8, 2]))
    assert int(num_accepted) == 3 and int(next_token) == 0  # bonus from the all-zero last row
