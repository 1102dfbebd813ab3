"""The search objective: NE with a FLOPs penalty in NE's own units (after TuNAS, arXiv 2008.06120).

With a FLOPs target ``F0`` the value of a candidate with NE ``q`` and ``F`` MFLOPs is

* ``relaxed``: ``q * (1 + weight * max(0, log2(F / F0)))`` (only candidates above the target pay);
* ``absolute``: ``q * (1 + weight * |log2(F / F0)|)`` (pulls every candidate towards the target);

and without a target it is ``q``. Lower is better. ``weight`` is a *relative NE cost per doubling
of FLOPs*: with the default ``0.01`` a model twice as expensive as the target must have an NE 1%
lower to tie with it, and a model ten times as expensive 3.3% lower. NE gains that matter in
ranking are tenths of a percent, so at the default a doubling must buy a clearly better model, and
a model at the target that is better by any margin wins. The penalty scales with NE itself, so the
same weight means the same trade on data whose NE sits near 0.5 or near 0.95.

>>> round(Objective(target_mflops=2.0, penalty="relaxed", weight=0.01).value(0.8, 8.0), 6)  # two doublings: +2%
0.816
>>> Objective(target_mflops=2.0, penalty="relaxed", weight=0.01).value(0.8, 1.0)  # under the target
0.8
>>> round(Objective(target_mflops=2.0, penalty="absolute", weight=0.01).value(0.8, 1.0), 6)  # one halving: +1%
0.808
>>> Objective().value(0.5, 123.0)
0.5
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rankitect.eval.result import TrialResult

PENALTIES = ("absolute", "relaxed")
DEFAULT_WEIGHT = 0.01  # relative NE per doubling of FLOPs; see the module docstring


def at_most(mflops: float | None, cap: float) -> bool:
    """Whether ``mflops`` is known and no more than ``cap`` (up to float rounding: a model at its
    own FLOPs is within them, however they were summed).

    >>> at_most(0.1 + 0.2, 0.3), at_most(0.31, 0.3), at_most(None, 0.3)
    (True, False, False)
    """
    return mflops is not None and mflops <= cap * (1 + 1e-9)


@dataclass(frozen=True)
class Objective:
    """NE times a FLOPs penalty; see the module docstring.

    Args:
        target_mflops: the FLOPs target ``F0`` in MFLOPs per example; ``None`` ranks by NE alone.
        penalty: ``"relaxed"`` or ``"absolute"`` (TuNAS).
        weight: relative NE cost per doubling of FLOPs, at least 0.
    """

    target_mflops: float | None = None
    penalty: str = "relaxed"
    weight: float = DEFAULT_WEIGHT

    def __post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if self.target_mflops is not None and not (self.target_mflops > 0 and math.isfinite(self.target_mflops)):
            raise ValueError(f"target_mflops must be a positive number or None, got {self.target_mflops!r}")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"weight must be a finite number >= 0, got {self.weight!r}")

    def doublings(self, mflops: float) -> float:
        """The doublings of FLOPs the penalty charges: ``max(0, log2(F/F0))`` or ``|log2(F/F0)|``."""
        if self.target_mflops is None:
            return 0.0
        if mflops <= 0:
            return 0.0 if self.penalty == "relaxed" else math.inf
        ratio = math.log2(mflops / self.target_mflops)
        return abs(ratio) if self.penalty == "absolute" else max(0.0, ratio)

    def value(self, ne: float, mflops: float) -> float:
        """The objective of a candidate with NE ``ne`` and ``mflops`` MFLOPs per example."""
        if self.target_mflops is None:
            return float(ne)
        return float(ne * (1.0 + self.weight * self.doublings(mflops)))

    def torch_value(self, ne: torch.Tensor, mflops: torch.Tensor) -> torch.Tensor:
        """:meth:`value` on tensors, differentiable in ``ne`` and ``mflops`` (DNAS expected FLOPs).

        ``ne`` and ``mflops`` broadcast against each other; the result has their broadcast shape.
        """
        if self.target_mflops is None:
            return ne + 0.0 * mflops  # keeps the broadcast shape and a (zero) gradient path
        ratio = (mflops / self.target_mflops).log2()
        cost = ratio.abs() if self.penalty == "absolute" else ratio.clamp(min=0.0)
        return ne * (1.0 + self.weight * cost)

    def __call__(self, result: TrialResult) -> float:
        """The objective of a trial: from its validation NE; ``inf`` for a failed trial."""
        if not result.ok:
            return math.inf
        return self.value(result.val_ne, result.mflops)

    def with_target(self, target_mflops: float | None) -> Objective:
        """The same penalty around another target (``auto`` targets are resolved after the baselines)."""
        return Objective(target_mflops=target_mflops, penalty=self.penalty, weight=self.weight)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Objective:
        return cls(**d)
