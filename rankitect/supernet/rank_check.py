"""Whether a supernet ranks: its scores of fixed probe paths, read again as it trains.

A supernet is worth following only where the order of its scores is the order training would give.
:class:`RankCheck` scores a fixed set of probe paths on fixed validation batches with the shared
weights (:func:`~rankitect.supernet.train.evaluate_path`) and compares, by Kendall's tau
(:func:`~rankitect.eval.ranking.kendall_tau`),

* each reading with the one before: once the order holds (``stable_tau`` or more for ``patience``
  readings in a row) more training no longer changes what the supernet says, so it can stop;
* the probes whose stand-alone NE is known (the trained baselines) with that NE: how well the
  supernet ranks at all. Below a threshold its choices are not worth retraining first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankitect.data.batch import Batch
from rankitect.eval.ranking import kendall_tau
from rankitect.supernet.model import Supernet


@dataclass(frozen=True)
class RankReading:
    """One reading: the probes' supernet NEs, tau against the previous reading and against the
    known stand-alone NEs (``nan`` where there is nothing to compare)."""

    scores: tuple[float, ...]
    tau_previous: float
    tau_truth: float


class RankCheck:
    """Reads the supernet's order of ``probes`` (see the module docstring).

    Args:
        supernet: the supernet being trained (read only: scored in eval mode, restored after).
        probes: paths of its space, scored at every reading.
        batches: the validation batches every reading scores on (the same each time).
        truth: each probe's stand-alone validation NE, ``None`` where unknown.
        stable_tau: tau with the previous reading at or above which the order holds.
        patience: readings in a row the order must hold before :attr:`stable` says so.
    """

    def __init__(self, supernet: Supernet, probes: Sequence[Mapping[str, Any]], batches: Sequence[Batch], *,
                 truth: Sequence[float | None] | None = None, stable_tau: float = 0.8, patience: int = 2) -> None:
        if len(probes) < 2:
            raise ValueError(f"RankCheck needs at least 2 probes, got {len(probes)}")
        if truth is not None and len(truth) != len(probes):
            raise ValueError(f"RankCheck: {len(truth)} known NEs for {len(probes)} probes")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.supernet, self.probes, self.batches = supernet, list(probes), list(batches)
        self.truth = list(truth) if truth is not None else [None] * len(self.probes)
        self.stable_tau, self.patience = stable_tau, patience
        self.readings: list[RankReading] = []
        self.held = 0

    @property
    def known(self) -> int:
        """Probes whose stand-alone NE is known."""
        return sum(t is not None for t in self.truth)

    def read(self) -> RankReading:
        """Score every probe now; the reading (also appended to :attr:`readings`)."""
        from rankitect.supernet.train import evaluate_path

        scores = tuple(evaluate_path(self.supernet, p, self.batches)["ne"] for p in self.probes)
        previous = self.readings[-1].scores if self.readings else None
        reading = RankReading(scores, _tau(scores, previous), _tau(scores, self.truth))
        self.held = self.held + 1 if reading.tau_previous >= self.stable_tau else 0
        self.readings.append(reading)
        return reading

    @property
    def stable(self) -> bool:
        """Whether the order has held ``patience`` readings in a row."""
        return self.held >= self.patience


def probe_check(supernet: Supernet, known: Sequence[tuple[Any, float]], start: Any | None, val: Any, *,
                batch_size: int, seed: int, probes: int = 8, batches: int = 5) -> RankCheck | None:
    """A :class:`RankCheck` on the trained architectures ``known`` (``(arch, stand-alone val NE)``,
    those the space holds) and distinct mutations of ``start`` up to ``probes`` paths in all, over
    the first ``batches`` validation batches of ``val``; None with fewer than two probes."""
    import numpy as np

    space = supernet.space
    chosen = [(a, ne) for a, ne in known if space.encode(a) is not None]
    seen = {a.hash for a, _ in chosen}
    rng = np.random.default_rng(seed)
    for _ in range(20 * probes):
        if start is None or len(chosen) >= probes:
            break
        child = space.mutate(start, rng)
        if child.hash not in seen:
            chosen.append((child, None))
            seen.add(child.hash)
    if len(chosen) < 2:
        return None
    it = iter(val.batches(batch_size, shuffle=False))
    fixed = [b for _, b in zip(range(batches), it)]
    return RankCheck(supernet, [space.encode(a) for a, _ in chosen], fixed, truth=[ne for _, ne in chosen])


def _tau(scores: Sequence[float], other: Sequence[float | None] | None) -> float:
    """Tau over the probes both have a finite value for; ``nan`` with fewer than two."""
    if other is None:
        return math.nan
    pairs = [(s, o) for s, o in zip(scores, other) if o is not None and math.isfinite(s) and math.isfinite(o)]
    if len(pairs) < 2:
        return math.nan
    return kendall_tau([s for s, _ in pairs], [o for _, o in pairs])


__all__ = ["RankCheck", "RankReading", "probe_check"]
