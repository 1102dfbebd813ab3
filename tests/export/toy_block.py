"""A user's own block, written as a user would: one file, registered, no rankitect change.

``tests/export/test_user_block.py`` searches with it, exports it and runs the export without
rankitect. Importing this module registers ``field_gate`` (the test unregisters it afterwards).
"""

from __future__ import annotations

import torch

from rankitect.blocks.base import FIELD, Block, register_block
from rankitect.blocks.common import MaskedLinear, check_positive, check_request, request_share


@register_block("field_gate")
class FieldGate(Block):
    """Squeeze-excitation over fields: each field scaled by a weight computed from every field's mean.

    Paper: FiBiNET, Huang et al., RecSys'19, arXiv 1905.09433 (SENET layer).

    Update rule: :math:`z_i = \\mathrm{mean}_d X_{i,d}`, :math:`a = \\mathrm{relu}(W_2\\,\\mathrm{relu}(W_1 z))`,
    :math:`Y_i = a_i X_i`.

    ROCS masking: both maps are block lower triangular, so the weights of the first ``R`` fields,
    and those fields' outputs, depend only on request fields (``request_out = R``).

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        reduction: the hidden width is ``max(1, N // reduction)``.
        request_in: request-side input fields (``None`` = unmasked).

    Shapes: ``(B, N, D) -> (B, N, D)``.

    >>> block = FieldGate(4, 3, reduction=2)
    >>> block(torch.randn(5, 4, 3)).shape, block.flops()
    (torch.Size([5, 4, 3]), 32)
    """

    in_kind = FIELD
    out_kind = FIELD
    num_inputs = 1

    def __init__(self, in_fields: int, dim: int, *, reduction: int = 2, request_in: int | None = None) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_positive("reduction", reduction)
        check_request(request_in, in_fields)
        hidden = max(1, in_fields // reduction)
        hidden_r = request_share(request_in, in_fields, hidden) if request_in is not None else None
        self.squeeze = MaskedLinear(in_fields, hidden, request_in=request_in, request_out=hidden_r or 0)
        self.excite = MaskedLinear(hidden, in_fields, request_in=hidden_r, request_out=request_in or 0)
        self.out_shape = (in_fields, dim)
        self.request_out = request_in or 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.mean(dim=2)  # (B, N, D) -> (B, N)
        a = torch.relu(self.excite(torch.relu(self.squeeze(z))))  # (B, N) -> (B, h) -> (B, N)
        return x * a.unsqueeze(2)  # (B, N, D) * (B, N, 1)

    def flops(self) -> int:
        return self.squeeze.flops() + self.excite.flops()
