"""k by goodput (generation/spec_decode/goodput.py): the batch's k from row acceptance and a cost table T(B, k).

Pure policy tests on hand-made cost tables; the batch engine's own steps are in test_batching.py.
"""

from __future__ import annotations

import pytest

from generation.spec_decode.goodput import (
    RowPlan,
    StepCosts,
    bucket,
    buckets_up_to,
    choose_k,
    expected_tokens,
    interpolate,
    measured_ks,
    row_k,
)


def auto(alpha: float, cap: int = 64, draft: bool = True) -> RowPlan:
    return RowPlan(alpha=alpha, cap=cap, fixed_k=None, uses_draft_model=draft)


def costs_from(step_seconds: dict[int, list[float]] | None = None, k_max: int = 8) -> StepCosts:
    """StepCosts whose timer returns ``step_seconds[bucket][k]`` (default: flat 10 ms)."""

    def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
        table = (step_seconds or {}).get(batch_size, [0.01] * (k_max + 1))
        return {k: table[k] for k in ks}

    return StepCosts(timer, k_max)


def test_buckets_are_powers_of_two() -> None:
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    # What a worker's warm-up measures: every bucket a batch of at most that many can use.
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(16) == (1, 2, 4, 8, 16)
    assert buckets_up_to(17) == (1, 2, 4, 8, 16, 32)


def test_every_small_k_is_timed_and_large_ones_sparsely() -> None:
    assert measured_ks(4) == [0, 1, 2, 3, 4]
    assert measured_ks(8) == list(range(9))
    assert measured_ks(20) == [*range(9), 16, 20]
    assert interpolate({0: 1.0, 8: 3.0, 16: 3.0}, 16)[4] == pytest.approx(2.0)


def test_the_table_is_what_was_timed_at_every_k() -> None:
    # A staircase with a jump after k = 4, as a 16-row step on this CPU: no interpolation
    # between 4 and 8 may smooth the jump away.
    stairs = [0.030, 0.034, 0.044, 0.046, 0.064, 0.120, 0.125, 0.130, 0.150]
    calls: list[tuple[int, list[int], bool]] = []

    def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
        calls.append((batch_size, ks, with_draft))
        return {k: stairs[k] for k in ks}

    costs = StepCosts(timer, 8)
    for k in range(9):
        assert costs.table(16, True).relative(k) == pytest.approx(stairs[k] / stairs[0])
    costs.table(9, True).relative(3)  # same bucket: measured once
    assert calls == [(16, list(range(9)), True)]


def test_no_auto_row_means_no_speculation_step() -> None:
    costs = costs_from()
    none = RowPlan(alpha=0.9, cap=0, fixed_k=None, uses_draft_model=False)
    fixed = RowPlan(alpha=0.9, cap=64, fixed_k=3, uses_draft_model=True)
    assert choose_k([none, fixed], costs) == 0


def test_free_drafts_are_taken_to_k_max_and_expensive_ones_not_at_all() -> None:
    flat = costs_from({1: [0.01] * 9})
    assert choose_k([auto(0.9)], flat) == 8
    # A pass that costs (k + 1) times a plain one (compute-bound) never pays: E(k) < k + 1.
    linear = costs_from({1: [0.01 * (k + 1) for k in range(9)]})
    assert choose_k([auto(0.9)], linear) == 0


def test_k_falls_as_the_batch_fills_the_machine_down_to_none() -> None:
    # T(B, k) = overhead + B (k + 1) c: per-call overhead at B = 1, arithmetic at B = 32.
    overhead, per_token = 0.010, 0.001
    tables = {
        b: [overhead + b * (k + 1) * per_token for k in range(9)] for b in (1, 2, 4, 8, 16, 32)
    }
    costs = costs_from(tables)
    chosen = [choose_k([auto(0.7)] * b, costs) for b in (1, 2, 4, 8, 16, 32)]
    assert chosen == sorted(chosen, reverse=True), chosen
    assert chosen[0] >= 2 and chosen[-1] == 0, chosen


def test_the_choice_maximises_expected_tokens_per_second() -> None:
    stairs = [0.030, 0.034, 0.044, 0.046, 0.064, 0.120, 0.125, 0.130, 0.150]
    costs = costs_from({4: stairs})
    rows = [auto(0.88), auto(0.6), auto(0.95, cap=2)]
    k = choose_k(rows, costs)

    def rate(k: int) -> float:
        tokens = sum(expected_tokens(r.alpha, row_k(r, k)) for r in rows)
        return tokens / stairs[max(row_k(r, k) for r in rows)]

    assert rate(k) == pytest.approx(max(rate(j) for j in range(9)))
    assert k == 3  # by hand: 3 drafts before the jump at k = 5 (and k = 4's 40 % step)


def test_a_fixed_k_is_kept_whatever_the_batch_chooses_and_the_budget_caps_every_row() -> None:
    fixed = RowPlan(alpha=0.9, cap=64, fixed_k=2, uses_draft_model=True)
    assert [row_k(fixed, k) for k in (0, 1, 5)] == [2, 2, 2]
    assert row_k(auto(0.9, cap=3), 6) == 3
    assert row_k(RowPlan(alpha=0.9, cap=1, fixed_k=4, uses_draft_model=True), 6) == 1


def test_suffix_steps_have_their_own_table_started_from_the_target_alone() -> None:
    stairs = [0.030, 0.034, 0.044, 0.046, 0.064, 0.120, 0.125, 0.130, 0.150]
    calls: list[tuple[int, bool]] = []

    def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
        calls.append((batch_size, with_draft))
        return {k: stairs[k] for k in ks}

    costs = StepCosts(timer, 8)
    assert costs.key(3, False, with_suffix=True) == (4, "suffix")
    assert costs.key(3, True, with_suffix=True) == (4, True)  # draft-model rows price the step
    suffix = costs.table(4, False, with_suffix=True)
    assert calls == [(4, False)]  # the target-alone passes, timed once for both tables
    assert suffix is not costs.table(4, False) and suffix.measured == stairs
    plain = [RowPlan(alpha=0.95, cap=64, fixed_k=None, uses_draft_model=False)] * 4
    with_suffix = [RowPlan(alpha=0.95, cap=64, fixed_k=None, uses_draft_model=False,
                           uses_suffix=True)] * 4  # fmt: skip
    assert choose_k(plain, costs) == choose_k(with_suffix, costs) == 3
    # Its own steps (tree lookups included) move it, not the target-alone table.
    for _ in range(50):
        costs.observe(4, False, False, 0, 0.030, with_suffix=True)
        costs.observe(4, False, False, 3, 0.300, with_suffix=True)
    assert suffix.relative(3) > costs.table(4, False).relative(3) * 2
    assert choose_k(plain, costs) == 3 and choose_k(with_suffix, costs) != 3
