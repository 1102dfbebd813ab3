"""The search objective: NE plus a FLOPs penalty (TuNAS, Bender et al. 2020, arXiv 2008.06120).

With a FLOPs target ``F0`` the value of a candidate with NE ``q`` and ``F`` MFLOPs is

* ``absolute``: ``q + weight * |F / F0 - 1|`` (pulls every candidate towards the target);
* ``relaxed``: ``q + weight * max(0, F / F0 - 1)`` (only candidates above the target pay);

and without a target it is ``q``. Lower is better. ``weight`` is in NE points per 100% FLOPs
deviation: with ``weight=0.1`` a model 10% over its target pays 0.01 NE.

>>> Objective(target_mflops=2.0, penalty="absolute", weight=0.5).value(0.5, 1.0)  # 0.5 + 0.5 * 0.5
0.75
>>> Objective(target_mflops=2.0, penalty="relaxed", weight=0.5).value(0.5, 1.0)  # under the target
0.5
>>> Objective(target_mflops=2.0, penalty="relaxed", weight=0.5).value(0.5, 3.0)  # 0.5 + 0.5 * 0.5
0.75
>>> Objective().value(0.5, 123.0)
0.5
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rankitect.search.base import TrialResult

PENALTIES = ("absolute", "relaxed")


@dataclass(frozen=True)
class Objective:
    """NE plus a FLOPs penalty; see the module docstring.

    Args:
        target_mflops: the FLOPs target ``F0`` in MFLOPs per example; ``None`` ranks by NE alone.
        penalty: ``"absolute"`` (TuNAS) or ``"relaxed"``.
        weight: the penalty weight, at least 0.
    """

    target_mflops: float | None = None
    penalty: str = "relaxed"
    weight: float = 0.1

    def __post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if self.target_mflops is not None and not (self.target_mflops > 0 and math.isfinite(self.target_mflops)):
            raise ValueError(f"target_mflops must be a positive number or None, got {self.target_mflops!r}")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"weight must be a finite number >= 0, got {self.weight!r}")

    def value(self, ne: float, mflops: float) -> float:
        """The objective of a candidate with NE ``ne`` and ``mflops`` MFLOPs per example."""
        if self.target_mflops is None:
            return float(ne)
        excess = mflops / self.target_mflops - 1.0
        cost = abs(excess) if self.penalty == "absolute" else max(0.0, excess)
        return float(ne + self.weight * cost)

    def torch_value(self, ne: torch.Tensor, mflops: torch.Tensor) -> torch.Tensor:
        """:meth:`value` on tensors, differentiable in ``ne`` and ``mflops`` (DNAS expected FLOPs).

        ``ne`` and ``mflops`` broadcast against each other; the result has their broadcast shape.
        """
        if self.target_mflops is None:
            return ne + 0.0 * mflops  # keeps the broadcast shape and a (zero) gradient path
        excess = mflops / self.target_mflops - 1.0
        cost = excess.abs() if self.penalty == "absolute" else excess.clamp(min=0.0)
        return ne + self.weight * cost

    def __call__(self, result: TrialResult) -> float:
        """The objective of a trial: from its validation NE; ``inf`` for a failed trial."""
        if not result.ok:
            return math.inf
        return self.value(result.val_ne, result.mflops)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Objective:
        return cls(**d)
