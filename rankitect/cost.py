"""What a candidate costs, measured once: plain and ROCS forward FLOPs and parameter counts.

:func:`measure` builds the architecture once on the ``meta`` device (no memory, no initialization)
and reads everything off that one model: the FLOPs of scoring every row in full (the blocks' own
:meth:`~rankitect.blocks.base.Block.flops`, the input projections and the head), the parameter
counts, and for a ROCS-masked architecture (``arch.rocs``) the FLOPs of
:func:`~rankitect.serve.score_requests`, split into the part run once per request and the part run
per candidate. FLOPs follow ``torch.utils.flop_counter``: matrix products only, a multiply-add
counts 2, embedding lookups are free.

It sits above ``space`` and ``serve`` (it builds with the one and counts ROCS scoring with the
other) and below ``search``, which prices each trial with it and keeps the :class:`Cost` in the
trial's result, so nothing is rebuilt to log it.

>>> from rankitect.space.testing import tiny_spec
>>> from rankitect.space.architecture import Architecture, BlockGene
>>> arch = Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8, "norm": "none"}),), embedding_dim=4)
>>> c = measure(arch, tiny_spec())  # mlp 4->8 (64 FLOPs, 40 params), head 8->1 (16 FLOPs, 9 params)
>>> c.flops, c.params, c.served_flops
(80, 49, 80.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rankitect.data.spec import FeatureSpec
from rankitect.serve.rocs import model_rocs_cost
from rankitect.space.architecture import Architecture
from rankitect.space.builder import build_model
from rankitect.space.flops import model_cost


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


def measure(arch: Architecture, spec: FeatureSpec, candidates_per_request: float | None = None) -> Cost:
    """The :class:`Cost` of ``arch`` on ``spec`` from one meta-device build.

    ``candidates_per_request`` (e.g. the test split's mean fan-out) sets how a ROCS-masked
    architecture's request part is shared in :attr:`Cost.served_flops`.
    """
    model = build_model(arch, spec, device="meta")
    plain = model_cost(model)
    per_request = per_candidate = None
    if arch.rocs:
        rocs = model_rocs_cost(model)
        per_request, per_candidate = rocs.per_request, rocs.per_candidate
    return Cost(flops=plain.flops, params=plain.params, dense_params=plain.dense_params,
                rocs_per_request=per_request, rocs_per_candidate=per_candidate,
                candidates_per_request=candidates_per_request)


__all__ = ["Cost", "measure"]
