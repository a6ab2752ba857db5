"""Prompt lookup (n-gram proposer) and the adaptive-k policy."""

from __future__ import annotations

import random

import pytest
import torch

from generation.adaptive import AdaptiveK, CostModel, RecentAcceptance, best_k, expected_tokens
from generation.proposers import NgramProposer, find_continuation


def lookup(tokens: list[int], k: int, max_n: int = 4) -> list[int]:
    """Return the proposer's draft, checked against the direct-scan reference."""
    proposer = NgramProposer(torch.device("cpu"), max_n=max_n)
    proposer.begin(tokens[:3])
    found = proposer.propose(tokens, k, 0.0, None).token_ids.tolist()
    assert found == find_continuation(tokens, k, max_n)
    return found


def test_longest_suffix_match_wins_over_a_more_recent_shorter_one() -> None:
    # Suffix [1, 2, 3] occurs at 0 (followed by 7, 8); [2, 3] alone occurs later (followed by 9).
    tokens = [1, 2, 3, 7, 8, 5, 2, 3, 9, 4, 1, 2, 3]
    assert lookup(tokens, 2) == [7, 8]
    assert lookup(tokens, 2, max_n=2) == [9, 4]  # n capped at 2: the latest [2, 3] wins


def test_falls_back_to_unigram_and_to_nothing() -> None:
    assert lookup([5, 6, 7, 5], 3) == [6, 7, 5]
    assert lookup([1, 2, 3, 4], 3) == []
    assert lookup([4], 3) == []


def test_continuation_is_cut_at_the_end_of_the_sequence() -> None:
    assert lookup([1, 2, 9, 1, 2], 5) == [9, 1, 2]


def test_prefers_a_match_with_a_full_continuation() -> None:
    # In a repetitive stream the latest match of [7, 7] leaves one token; an earlier one leaves k.
    assert lookup([7] * 8, 4, max_n=2) == [7, 7, 7, 7]
    # Two full continuations: the most recent wins.
    assert lookup([1, 2, 3, 1, 4, 5, 1], 2) == [4, 5]


def test_incremental_index_agrees_with_a_direct_scan() -> None:
    rng = random.Random(0)
    for trial in range(30):
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        proposer = NgramProposer(torch.device("cpu"), max_n=3)
        proposer.begin(tokens[:1])
        for end in range(1, len(tokens) + 1):  # the sequence grows as in generation
            k = rng.randrange(1, 6)
            found = proposer.propose(tokens[:end], k, 0.0, None).token_ids.tolist()
            assert found == find_continuation(tokens[:end], k, 3), (trial, end)


def test_rejects_bad_n_range() -> None:
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramProposer(torch.device("cpu"), max_n=0)


def test_expected_tokens_matches_the_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_best_k_grows_with_acceptance_and_shrinks_with_cost() -> None:
    cheap = CostModel.linear(target_slope=0.1, proposer_cost=0.05)
    ks = [best_k(alpha, cheap, 8) for alpha in (0.1, 0.5, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] == 1 and ks[-1] >= 6
    dear = CostModel.linear(target_slope=0.1, proposer_cost=0.5)
    assert best_k(0.8, dear, 8) < best_k(0.8, cheap, 8)


def test_adaptive_k_follows_the_request() -> None:
    policy = AdaptiveK(cost=CostModel.linear(target_slope=0.1, proposer_cost=0.05), prior_alpha=0.6)
    start = policy.next_k()
    for _ in range(6):
        policy.observe(policy.next_k(), policy.next_k())  # everything accepted
    assert policy.next_k() > start
    high = policy.next_k()
    for _ in range(20):
        policy.observe(policy.next_k(), 0)  # everything rejected
    assert policy.next_k() < high and policy.next_k() == 1
    assert policy.request_alpha() is not None and 0 < policy.request_alpha() < 1  # type: ignore[operator]


def test_recent_acceptance_moves_toward_finished_requests() -> None:
    recent = RecentAcceptance(alpha=0.6)
    recent.update(None)
    assert recent.alpha == 0.6
    recent.update(1.0)
    assert 0.6 < recent.alpha < 1.0


def test_cost_model_learns_each_k_from_timed_rounds() -> None:
    # Measured as a line, but this machine's rounds are a staircase: 2 and 3 drafts cost the same.
    cost = CostModel.linear(target_slope=0.05, proposer_cost=0.05)
    assert cost.round_cost(4) == pytest.approx(1.4 / 1.1)
    stairs = {1: 1.3, 2: 1.6, 3: 1.6, 4: 2.0}
    for i in range(300):
        k = 1 + i % 4
        cost.observe(k, 0.004 * stairs[k] * (1.1 if (i // 4) % 2 else 0.9))
    for k in (2, 3, 4):
        assert cost.round_cost(k) == pytest.approx(stairs[k] / stairs[1], rel=0.05)
    # With alpha 0.7, k = 3 beats k = 2 on the staircase, where the line would pick k = 4.
    assert best_k(0.7, cost, 4) == 3


def test_cost_model_scales_untried_k_by_the_load_it_sees() -> None:
    cost = CostModel.linear(target_slope=0.1, proposer_cost=0.2, k_max=8)
    for _ in range(50):
        cost.observe(3, 2.0 * (1.0 + 0.3 * 3))  # every round twice as slow as measured
    # Relative costs keep the measured shape: a machine twice as busy slows every k alike.
    assert cost.round_cost(6) / cost.round_cost(3) == pytest.approx(2.8 / 1.9, rel=0.02)
    assert cost.round_cost(6) == pytest.approx(2.8 / 1.3, rel=0.02)


def test_cost_model_refuses_an_empty_or_non_positive_table() -> None:
    with pytest.raises(ValueError, match="measured"):
        CostModel([1.0])
    with pytest.raises(ValueError, match="measured"):
        CostModel([1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="k: must be in"):
        CostModel.linear(0.1, 0.1, k_max=4).round_cost(5)
