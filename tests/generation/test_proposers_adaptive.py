"""Prompt lookup (n-gram proposer), and the acceptance estimate and step costs goodput reads."""

from __future__ import annotations

import random

import pytest

from generation.spec_decode.goodput import Acceptance, CostModel, RecentAcceptance, expected_tokens
from generation.spec_decode.ngram import NgramProposer, pick_start


def find_continuation(tokens: list[int], k: int, max_n: int, min_n: int = 1) -> list[int]:
    """Return up to ``k`` tokens that followed an earlier match of the longest suffix n-gram.

    A direct scan: the reference for ``NgramProposer``'s incremental index.
    """
    seq_len = len(tokens)
    for n in range(min(max_n, seq_len - 1), min_n - 1, -1):
        suffix = tokens[seq_len - n :]
        starts = [i for i in range(seq_len - n) if tokens[i : i + n] == suffix]
        start = pick_start(starts, n, k, seq_len)
        if start is not None:
            return tokens[start : start + k]
    return []


def lookup(tokens: list[int], k: int, max_n: int = 4) -> list[int]:
    """Return the proposer's draft, checked against the direct-scan reference."""
    proposer = NgramProposer(max_n=max_n)
    proposer.propose(tokens[:3], 1)
    found = proposer.propose(tokens, k)
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
        proposer = NgramProposer(max_n=3)
        for end in range(1, len(tokens) + 1):  # the sequence grows as in generation
            k = rng.randrange(1, 6)
            found = proposer.propose(tokens[:end], k)
            assert found == find_continuation(tokens[:end], k, 3), (trial, end)


def test_rejects_bad_n_range() -> None:
    with pytest.raises(ValueError, match="max_n must be >= 1"):
        NgramProposer(max_n=0)


def test_expected_tokens_matches_the_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_acceptance_follows_the_request() -> None:
    estimate = Acceptance(prior_alpha=0.6)
    assert estimate.alpha == pytest.approx(0.6) and estimate.request_alpha() is None
    for _ in range(6):
        estimate.observe(4, 4)  # everything accepted
    high = estimate.alpha
    assert high > 0.9
    for _ in range(20):
        estimate.observe(4, 0)  # everything rejected
    assert estimate.alpha < 0.25 < high
    estimate.observe(0, 0)  # a round without drafts says nothing
    assert estimate.request_alpha() == pytest.approx(24 / (24 + 20))


def test_recent_acceptance_moves_toward_finished_requests() -> None:
    recent = RecentAcceptance(alpha=0.6)
    recent.update(None)
    assert recent.alpha == 0.6
    recent.update(1.0)
    assert 0.6 < recent.alpha < 1.0


def test_cost_model_learns_each_k_from_timed_steps() -> None:
    # Measured as a line, but this machine's steps are a staircase: k = 2 and 3 cost the same.
    cost = CostModel([1.0 + 0.1 * k for k in range(5)])
    assert cost.relative(4) == pytest.approx(1.4)
    stairs = {0: 1.0, 1: 1.3, 2: 1.6, 3: 1.6, 4: 2.0}
    for i in range(300):
        k = i % 5
        cost.observe(k, 0.004 * stairs[k] * (1.1 if (i // 5) % 2 else 0.9))
    for k in (1, 2, 3, 4):
        assert cost.relative(k) == pytest.approx(stairs[k], rel=0.1)  # the line says 1.2 at k = 2


def test_cost_model_scales_untried_k_by_the_load_it_sees() -> None:
    cost = CostModel([1.0 + 0.3 * k for k in range(9)])
    for _ in range(50):
        cost.observe(3, 2.0 * (1.0 + 0.3 * 3))  # every step twice as slow as measured
    # Relative costs keep the measured shape: a machine twice as busy slows every k alike.
    assert cost.relative(6) / cost.relative(3) == pytest.approx(2.8 / 1.9, rel=0.02)
    assert cost.relative(6) == pytest.approx(2.8, rel=0.02)


def test_cost_model_refuses_an_empty_or_non_positive_table() -> None:
    with pytest.raises(ValueError, match="measured"):
        CostModel([])
    with pytest.raises(ValueError, match="measured"):
        CostModel([1.0, 0.0, 2.0])
