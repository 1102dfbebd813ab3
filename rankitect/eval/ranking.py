"""Rank agreement between two scorings of the same items: Kendall's tau-b by counting pairs.

How well a cheap score (a supernet's, a surrogate's) orders architectures as training each one
does: over every pair of items, concordant pairs (both scorings order them alike) minus discordant
ones, over the pairs each scoring does not tie (Kendall 1945, tau-b):

    tau_b = (C - D) / sqrt((n0 - n1) * (n0 - n2)),  n0 = n (n - 1) / 2

with ``n1`` and ``n2`` the pairs tied in the first and in the second scoring. 1: the same order,
-1: reversed, 0: no agreement beyond chance. A plain O(n^2) loop: the item counts it serves are tens.

>>> kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]), kendall_tau([1, 2, 3], [3, 2, 1])
(1.0, -1.0)
>>> round(kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]), 4)  # one of six pairs swapped: (5 - 1) / 6
0.6667
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of paired scores ``x`` and ``y`` (equal lengths); ``nan`` when either is
    constant or there are fewer than two items."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: {len(x)} scores against {len(y)}")
    concordant = discordant = tied_x = tied_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
            tied_x += dx == 0
            tied_y += dy == 0
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (concordant - discordant) / denominator if denominator > 0 else math.nan


def _sign(v: float) -> int:
    return int(v > 0) - int(v < 0)


__all__ = ["kendall_tau"]
