"""``sum``: NASRec element-wise sum of two flat inputs brought to one width."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FLAT, Block, register_block
from rankitect.blocks.common import MaskedLinear, check_positive, check_request_pair, request_share
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_linear
from rankitect.blocks.split import Split, add, linear


@register_block("sum")
class Sum(Block):
    """Element-wise sum of two flat inputs, each first projected to ``width``, then ReLU.

    Paper: NASRec, Zhang et al., WWW'23, arXiv 2207.07187 ("sum" dense op: inputs of different
    widths are linearly projected to a common width before the addition).

    Update rule: :math:`y = \\mathrm{relu}(P_l\\, l + P_r\\, r + b)`.

    ROCS masking with ``request_in = (R_l, R_r)``: both projections are block lower triangular onto
    the same first ``request_out`` outputs, a share of ``width`` proportional to
    ``(R_l + R_r) / (left_features + right_features)``, or ``rocs_share`` of ``width``.

    Args:
        left_features: width of the left input.
        right_features: width of the right input.
        width: output width.
        request_in: ``(left R, right R)`` request-side units, or ``None`` (unmasked).
        rocs_share: fraction of the outputs that are request side (``None``: proportional).

    Shapes: ``(B, left_features), (B, right_features) -> (B, width)``.

    >>> block = Sum(6, 4, width=8)
    >>> block(torch.randn(3, 6), torch.randn(3, 4)).shape, block.flops()
    (torch.Size([3, 8]), 160)
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
        masked = left_r is not None and right_r is not None
        both = left_features + right_features
        self.request_out = request_share(left_r + right_r, both, width, rocs_share) if masked else 0
        out_r = self.request_out
        self.left = MaskedLinear(left_features, width, request_in=left_r, request_out=out_r)
        self.right = MaskedLinear(right_features, width, bias=False, request_in=right_r, request_out=out_r)
        self.out_shape = (width,)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(left) + self.right(right))  # (B, L) -> (B, width); (B, R) -> (B, width)

    def flops(self) -> int:
        return self.left.flops() + self.right.flops()

    def forward_split(self, left: Split, right: Split) -> Split:
        return add(linear(self.left, left), linear(self.right, right)).map(torch.relu)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        left, right = in_pos
        width = self.out_shape[0]
        params = {**slice_linear("left.", widest.left, width, left, take),
                  **slice_linear("right.", widest.right, width, right, take)}
        return params, torch.arange(width)
