"""Kendall's tau-b by pair counting, against scipy's and a hand-worked example."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rankitect.eval.ranking import kendall_tau


def test_hand_worked_example_with_ties():
    """x = (1, 2, 2, 3), y = (1, 3, 2, 2): of 6 pairs, (1,2) (1,3) (1,4) concordant, (2,4) discordant,
    (2,3) tied in x, (3,4) tied in y, so tau_b = (3 - 1) / sqrt((6 - 1) * (6 - 1)) = 0.4."""
    assert kendall_tau([1, 2, 2, 3], [1, 3, 2, 2]) == pytest.approx(0.4)


def test_matches_scipy_with_and_without_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (2, 5, 20, 37):
        for ties in (False, True):
            x, y = rng.normal(size=n), rng.normal(size=n)
            if ties:
                x, y = np.round(x), np.round(y * 2)
            expected = stats.kendalltau(x, y).statistic  # tau-b, scipy's default
            got = kendall_tau(list(x), list(y))
            assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)


def test_constant_scores_and_mismatched_lengths():
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3])) and math.isnan(kendall_tau([1], [2]))
    with pytest.raises(ValueError, match="3 scores against 2"):
        kendall_tau([1, 2, 3], [1, 2])
