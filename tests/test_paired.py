"""testkit/paired.py: the palindromic order of a round and the sign-test interval of a median."""

from __future__ import annotations

from collections import Counter
from math import comb

import pytest

from testkit.paired import palindrome, sign_interval, summary


def test_a_round_runs_every_arm_twice_mirrored_and_positions_rotate() -> None:
    arms = ("off", "on", "control")
    orders = [palindrome(arms, n) for n in range(3)]
    assert orders[0] == ["off", "on", "control", "control", "on", "off"]
    for order in orders:
        assert order == order[::-1]
        assert Counter(order) == {a: 2 for a in arms}
    # Over as many rounds as arms, each arm opens a round once: no arm always goes first.
    assert sorted(order[0] for order in orders) == sorted(arms)


def test_the_interval_is_the_order_statistics_the_binomial_allows() -> None:
    values = [float(v) for v in range(1, 11)]  # n = 10: the 2nd and 9th smallest, 97.9%
    low, high, coverage = sign_interval(values[::-1])
    assert (low, high) == (2.0, 9.0)
    assert coverage == pytest.approx(1 - 2 * (1 + 10) / 2**10)
    # The next narrower one (3rd, 8th) would cover less than 95%.
    assert 1 - 2 * sum(comb(10, i) for i in range(3)) / 2**10 < 0.95


def test_too_few_rounds_give_the_whole_range_and_say_its_coverage() -> None:
    low, high, coverage = sign_interval([1.0, 3.0, 2.0, 5.0])
    assert (low, high) == (1.0, 5.0)
    assert coverage == pytest.approx(1 - 2 / 16)


def test_summary_reports_the_median_inside_its_interval() -> None:
    s = summary([0.9, 1.1, 1.0, 0.95, 1.05, 1.02, 0.98, 1.01, 0.99])
    assert s["median"] == 1.0
    assert s["low"] <= s["median"] <= s["high"]
    assert (s["low"], s["high"], s["rounds"]) == (0.95, 1.05, 9)


def test_no_values_is_refused() -> None:
    with pytest.raises(ValueError):
        sign_interval([])
