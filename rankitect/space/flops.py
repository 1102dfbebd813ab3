"""Analytic cost of an architecture: forward FLOPs per example and parameter counts.

Computed from the blocks' own :meth:`~rankitect.blocks.base.Block.flops` and the builder's input
projections and head, on a model built on the ``meta`` device (no memory, no initialization).
FLOPs follow ``torch.utils.flop_counter``: matrix products only, a multiply-add counts 2,
embedding lookups are free.

These are the plain counts (every row computing everything) that the space sizes itself by. What a
search prices a candidate at, ROCS serving included, is :func:`rankitect.cost.measure`, from the
same one build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture
from rankitect.space.builder import RankingModel, build_model


@dataclass(frozen=True)
class Cost:
    """What an architecture costs per example, as plain JSON-able numbers.

    Args:
        flops: forward FLOPs per example with every row computed in full.
        params: parameters, embedding tables included.
        dense_params: parameters without the embedding tables.
        rocs_per_request: ROCS scoring's FLOPs run once per request (``None``: not ROCS-masked).
        rocs_per_candidate: ROCS scoring's FLOPs run per candidate (``None``: not ROCS-masked).
        candidates_per_request: the fan-out the request part is shared over (``None``: not given).
    """

    flops: int
    params: int
    dense_params: int
    rocs_per_request: int | None = None
    rocs_per_candidate: int | None = None
    candidates_per_request: float | None = None

    def __post_init__(self) -> None:
        cpr = self.candidates_per_request
        if cpr is not None and not (cpr > 0 and math.isfinite(cpr)):
            raise ValueError(f"candidates_per_request must be a positive number, got {cpr!r}")

    @property
    def mflops(self) -> float:
        """Plain forward MFLOPs per example (every row computing everything)."""
        return self.flops / 1e6

    @property
    def sparse_params(self) -> int:
        return self.params - self.dense_params

    @property
    def rocs(self) -> bool:
        return self.rocs_per_candidate is not None

    @property
    def served_flops(self) -> float:
        """FLOPs per example as the model is served: with ROCS and a fan-out, the request part
        shared by the request's candidates; otherwise the plain FLOPs."""
        if not self.rocs or self.candidates_per_request is None:
            return float(self.flops)
        return self.rocs_per_candidate + self.rocs_per_request / self.candidates_per_request

    @property
    def served_mflops(self) -> float:
        """:attr:`served_flops` in MFLOPs: what a search ranks a candidate by."""
        return self.served_flops / 1e6

    def rocs_metrics(self) -> dict[str, float]:
        """The ROCS numbers a trial's run logs (empty unless ROCS-masked with a fan-out)."""
        if not self.rocs or self.candidates_per_request is None:
            return {}
        return {"rocs/mflops_per_example": self.served_mflops, "rocs/mflops_per_request": self.rocs_per_request / 1e6,
                "rocs/mflops_unshared": self.mflops, "rocs/candidates_per_request": self.candidates_per_request}


def cost(arch: Architecture, spec: FeatureSpec) -> Cost:
    """FLOPs and parameter counts of ``arch`` on ``spec``, from one meta-device build.

    >>> from rankitect.space.testing import tiny_spec
    >>> from rankitect.space.architecture import BlockGene
    >>> arch = Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8, "norm": "none"}),), embedding_dim=4)
    >>> c = cost(arch, tiny_spec())  # mlp 4->8 (64 FLOPs, 40 params), head 8->1 (16 FLOPs, 9 params)
    >>> c.flops, c.params, c.dense_params
    (80, 49, 49)
    """
    return model_cost(build_model(arch, spec, device="meta"))


def model_cost(model: RankingModel) -> Cost:
    """:func:`cost` of a model already built (on the ``meta`` device: no second build)."""
    total = sum(p.numel() for p in model.parameters())
    sparse = sum(p.numel() for p in model.sparse_parameters())
    return Cost(flops=model.flops(), params=total, dense_params=total - sparse)


def flops(arch: Architecture, spec: FeatureSpec) -> int:
    """Forward FLOPs per example of ``arch`` on ``spec`` (multiply-add = 2)."""
    return cost(arch, spec).flops


def params(arch: Architecture, spec: FeatureSpec) -> int:
    """Exact parameter count of ``arch`` on ``spec``, embedding tables included."""
    return cost(arch, spec).params


def dense_params(arch: Architecture, spec: FeatureSpec) -> int:
    """Parameter count without the embedding tables."""
    return cost(arch, spec).dense_params
