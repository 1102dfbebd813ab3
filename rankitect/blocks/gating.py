"""``gating``: NASRec sigmoid gating of one flat input by another."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FLAT, Block, register_block
from rankitect.blocks.common import MaskedLinear, check_positive, check_request_pair, request_share
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_linear
from rankitect.blocks.split import Split, linear


@register_block("gating")
class Gating(Block):
    """Sigmoid gating: the left input decides, unit by unit, how much of the right input passes.

    Paper: NASRec, Zhang et al., WWW'23, arXiv 2207.07187 ("sigmoid gating" dense op).

    Update rule: :math:`y = P\\,(r \\odot \\sigma(W l + b_W)) + b_P`.

    ROCS masking with ``request_in = (R_l, R_r)``: ``W`` is block lower triangular from the left's
    ``R_l`` request units to the right's ``R_r``, so the first ``R_r`` gated units depend only on
    request units; ``P`` maps those to the first ``request_out`` outputs (share of ``width``
    proportional to ``R_r / right_features``, or ``rocs_share``).

    Args:
        left_features: width of the left (gating) input.
        right_features: width of the right (gated) input.
        width: output width.
        request_in: ``(left R, right R)`` request-side units, or ``None`` (unmasked).
        rocs_share: fraction of the outputs that are request side (``None``: proportional).

    Shapes: ``(B, left_features), (B, right_features) -> (B, width)``.

    >>> block = Gating(6, 4, width=8, request_in=(2, 1))
    >>> block(torch.randn(3, 6), torch.randn(3, 4)).shape, block.request_out, block.flops()
    (torch.Size([3, 8]), 2, 112)
    """

    in_kind = FLAT
    out_kind = FLAT
    num_inputs = 2

    def __init__(
        self,
        left_features: int,
        right_features: int,
        *,
        width: int,
        request_in: tuple[int, int] | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        check_positive("left_features", left_features)
        check_positive("right_features", right_features)
        check_positive("width", width)
        left_r, right_r = check_request_pair(request_in, left_features, right_features)
        gated_r = right_r if left_r is not None else None
        self.gate = MaskedLinear(left_features, right_features, request_in=left_r, request_out=gated_r or 0)
        self.request_out = request_share(gated_r, right_features, width, rocs_share)
        self.proj = MaskedLinear(right_features, width, request_in=gated_r, request_out=self.request_out)
        self.out_shape = (width,)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        gated = right * torch.sigmoid(self.gate(left))  # (B, L) -> (B, R); (B, R) * (B, R)
        return self.proj(gated)  # (B, R) -> (B, width)

    def flops(self) -> int:
        return self.gate.flops() + self.proj.flops()

    def forward_split(self, left: Split, right: Split) -> Split:
        gate = linear(self.gate, left)
        return linear(self.proj, right.like(right.req * torch.sigmoid(gate.req), right.cand * torch.sigmoid(gate.cand)))

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        left, right = in_pos
        width = self.out_shape[0]
        params = {**slice_linear("gate.", widest.gate, right, left, take),
                  **slice_linear("proj.", widest.proj, width, right, take)}
        return params, torch.arange(width)
