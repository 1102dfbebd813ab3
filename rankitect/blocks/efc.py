"""``efc``: a linear map along the field axis (N fields -> N' fields)."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FIELD, Block, register_block
from rankitect.blocks.common import FieldLinear, check_positive, check_request, request_share
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_linear
from rankitect.blocks.split import Split, field_linear


@register_block("efc")
class EFC(Block):
    """Embedded fully connected layer: new fields as linear combinations of the input fields.

    Paper: AutoCTR, Song et al., KDD'20, arXiv 2006.14827; NASRec, arXiv 2207.07187 ("EFC").

    Update rule: :math:`Y_{o,d} = \\sum_n W_{o,n} X_{n,d} + b_o`.

    ROCS masking: ``W`` is block lower triangular, so the first ``request_out`` output fields
    (proportional share of ``out_fields``, or ``rocs_share`` of them) combine only the request-side
    input fields.

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        out_fields: number N' of output fields.
        request_in: request-side input fields (``None`` = unmasked).
        rocs_share: fraction of the output fields that are request side (``None``: proportional).

    Shapes: ``(B, N, D) -> (B, N', D)``.

    >>> block = EFC(5, 4, out_fields=3, request_in=2)
    >>> block(torch.randn(2, 5, 4)).shape, block.request_out, block.flops()
    (torch.Size([2, 3, 4]), 1, 120)
    """

    in_kind = FIELD
    out_kind = FIELD
    num_inputs = 1

    def __init__(
        self,
        in_fields: int,
        dim: int,
        *,
        out_fields: int,
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_positive("out_fields", out_fields)
        check_request(request_in, in_fields)
        self.request_out = request_share(request_in, in_fields, out_fields, rocs_share)
        self.linear = FieldLinear(in_fields, out_fields, request_in=request_in, request_out=self.request_out)
        self.dim = dim
        self.out_shape = (out_fields, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)  # (B, N, D) -> (B, N', D)

    def flops(self) -> int:
        return self.linear.field_flops(self.dim)

    def forward_split(self, x: Split) -> Split:
        return field_linear(self.linear, x)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        fields = self.out_shape[0]
        return slice_linear("linear.", widest.linear, fields, in_pos, take), torch.arange(fields)
