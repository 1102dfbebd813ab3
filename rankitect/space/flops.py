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

from dataclasses import dataclass

from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture
from rankitect.space.builder import RankingModel, build_model


@dataclass(frozen=True)
class Cost:
    """What an architecture costs: ``flops`` per example (forward) and parameter counts."""

    flops: int
    params: int
    dense_params: int

    @property
    def mflops(self) -> float:
        return self.flops / 1e6

    @property
    def sparse_params(self) -> int:
        return self.params - self.dense_params


def cost(arch: Architecture, spec: FeatureSpec) -> Cost:
    """FLOPs and parameter counts of ``arch`` on ``spec``, from one meta-device build.

    >>> from rankitect.space.testing import tiny_spec
    >>> from rankitect.space.architecture import BlockGene
    >>> arch = Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8, "norm": "none"}),), embedding_dim=4)
    >>> cost(arch, tiny_spec())  # mlp 4->8 (64 FLOPs, 40 params), head 8->1 (16 FLOPs, 9 params)
    Cost(flops=80, params=49, dense_params=49)
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
