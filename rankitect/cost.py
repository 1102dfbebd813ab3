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

from dataclasses import replace

from rankitect.data.spec import FeatureSpec
from rankitect.serve.rocs import model_rocs_cost
from rankitect.space.architecture import Architecture
from rankitect.space.builder import build_model
from rankitect.space.flops import Cost, model_cost


def measure(arch: Architecture, spec: FeatureSpec, candidates_per_request: float | None = None) -> Cost:
    """The :class:`Cost` of ``arch`` on ``spec`` from one meta-device build.

    ``candidates_per_request`` (e.g. the test split's mean fan-out) sets how a ROCS-masked
    architecture's request part is shared in :attr:`Cost.served_flops`.
    """
    model = build_model(arch, spec, device="meta")
    plain = replace(model_cost(model), candidates_per_request=candidates_per_request)
    if not arch.rocs:
        return plain
    rocs = model_rocs_cost(model)
    return replace(plain, rocs_per_request=rocs.per_request, rocs_per_candidate=rocs.per_candidate)


__all__ = ["Cost", "measure"]
