"""The rejection sampler's output follows the target distribution (statistical tests)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from generation.spec_decode.proposers import Drafts
from generation.spec_decode.rejection_sampler import PLACEHOLDER, rejection_sample, verify

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


def _drafts(rows: list[list[int]], probs: list[torch.Tensor | None] | None = None) -> Drafts:
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [0] * (width - len(r)) for r in rows]).view(len(rows), width)
    return Drafts(padded, [len(r) for r in rows], probs or [None] * len(rows))


def test_greedy_rows_stop_at_the_first_mismatch_and_break_ties_low() -> None:
    logits = torch.zeros(4, 4, VOCAB)  # [B, k + 1, vocab]
    logits[:, 0, 7] = logits[:, 1, 8] = 1.0
    logits[:, 2, 9] = logits[:, 2, 2] = 1.0  # a tie: argmax takes the lowest id, 2
    drafts = _drafts([[7, 8, 9], [7, 8, 2], [7], []])
    out = verify(logits, drafts, [0.0] * 4, [None] * 4)
    P = PLACEHOLDER
    assert out == [
        [7, 8, 2, P],  # two accepted, then the target's token where the third differed
        [7, 8, 2, 0],  # all accepted, and the bonus token from the all-zero last row
        [7, 8, P, P],  # a shorter draft (padding is never accepted)
        [7, P, P, P],  # no draft: the target's next token
    ]


def test_sampled_rows_draw_from_their_own_generator_in_any_company() -> None:
    generator = torch.Generator().manual_seed(4)
    target = torch.randn(3, 3, VOCAB, generator=generator) * 2.0  # [B, k + 1, vocab]
    draft_probs = torch.softmax(torch.randn(2, VOCAB, generator=generator), dim=-1)
    rows = [[3, 4], [5], [6, 7]]

    def run(temperatures: list[float], seed: int) -> list[list[int]]:
        gens = [torch.Generator().manual_seed(seed + b) for b in range(3)]
        drafts = _drafts(rows, [draft_probs, None, None])
        return verify(target, drafts, temperatures, gens)

    mixed = run([1.0, 0.0, 0.7], 10)
    # Row 0 gets the same tokens whatever the other rows are (greedy, sampled, other seeds).
    assert run([1.0, 0.7, 0.0], 10)[0] == mixed[0]
    gens = [torch.Generator().manual_seed(10)]
    alone = verify(target[:1], _drafts(rows[:1], [draft_probs]), [1.0], gens)
    assert alone[0] == mixed[0]
    assert mixed[1] == verify(target, _drafts(rows), [0.0] * 3, [None] * 3)[1]
