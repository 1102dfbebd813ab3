"""``fm``: the field-wise factorization machine, keeping the embedding dimension."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FIELD, FLAT, Block, register_block
from rankitect.blocks.common import check_positive, check_request
from rankitect.blocks.slicing import InPos, Params, Take, pick
from rankitect.blocks.split import Split


def fm_pairs(x: torch.Tensor) -> torch.Tensor:
    """``½[(Σ_i v_i)² − Σ_i v_i²]`` per coordinate: ``(B, N, D) -> (B, D)``."""
    total = x.sum(dim=1)  # (B, D)
    return 0.5 * (total * total - (x * x).sum(dim=1))


@register_block("fm")
class FM(Block):
    """Factorization machine over field embeddings, one value per embedding coordinate.

    Paper: Rendle, "Factorization Machines", ICDM 2010 (field-wise form as in DeepFM,
    arXiv 1703.04247, before the sum over D).

    Update rule:
    :math:`y_d = \\tfrac12[(\\sum_i v_{i,d})^2 - \\sum_i v_{i,d}^2] = \\sum_{i<j} v_{i,d} v_{j,d}`.

    Only elementwise work, so 0 FLOPs by the ``torch.utils.flop_counter`` convention.
    ROCS masking (``R >= 2`` request fields): the output widens to ``2D`` =
    ``[FM over the request fields, FM over all fields]`` with ``request_out = D``; with ``R < 2``
    no request pair exists and the block stays ``(D,)`` with ``request_out = 0``.

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        request_in: request-side input fields (``None`` = unmasked).

    Shapes: ``(B, N, D) -> (B, D)``, or ``(B, 2D)`` when masked with ``R >= 2``.

    >>> block = FM(5, 4, request_in=2)
    >>> block(torch.randn(3, 5, 4)).shape, block.request_out, block.flops()
    (torch.Size([3, 8]), 4, 0)
    """

    in_kind = FIELD
    out_kind = FLAT
    num_inputs = 1

    def __init__(self, in_fields: int, dim: int, *, request_in: int | None = None) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_request(request_in, in_fields)
        self.split = request_in if request_in is not None and request_in >= 2 else 0
        self.request_out = dim if self.split else 0
        self.out_shape = (2 * dim if self.split else dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = fm_pairs(x)  # (B, N, D) -> (B, D)
        if not self.split:
            return full
        return torch.cat([fm_pairs(x[:, : self.split]), full], dim=1)  # (B, D) + (B, D) -> (B, 2D)

    def flops(self) -> int:
        return 0

    def forward_split(self, x: Split) -> Split:
        u, c = x.req, x.cand
        total = u.sum(dim=1).index_select(0, x.index) + c.sum(dim=1)  # (B, D): sum over all fields
        squares = (u * u).sum(dim=1).index_select(0, x.index) + (c * c).sum(dim=1)  # (B, D)
        full = 0.5 * (total * total - squares)
        req = fm_pairs(u) if self.split else u.new_zeros(u.shape[0], 0)  # (Q, D) or (Q, 0)
        return x.like(req, full)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        return {}, torch.arange(self.out_shape[0])
