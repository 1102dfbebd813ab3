"""``dcn``: DCNv2 cross layers on a flat input, full or low rank."""

from __future__ import annotations

import torch
from torch import nn

from rankitect.blocks.base import FLAT, Block, register_block
from rankitect.blocks.common import MaskedLinear, check_positive, check_request, request_share
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_linear
from rankitect.blocks.split import Split, linear


class CrossMap(nn.Module):
    """``W x + b`` of one cross layer: full ``W`` or ``W = U Vᵀ`` of rank ``low_rank``.

    Masked, both factors are block lower triangular: the first ``request_share`` rank units see
    only request inputs and the request outputs see only those rank units, so ``U Vᵀ`` is too.
    """

    def __init__(self, features: int, low_rank: int, request_in: int | None, rocs_share: float | None = None) -> None:
        super().__init__()
        out_request = request_in or 0
        if low_rank == 0:
            self.down: nn.Module = nn.Identity()
            self.up = MaskedLinear(features, features, request_in=request_in, request_out=out_request)
        else:
            rank_request = request_share(request_in, features, low_rank, rocs_share) if request_in is not None else None
            self.down = MaskedLinear(
                features, low_rank, bias=False, request_in=request_in, request_out=rank_request or 0
            )
            self.up = MaskedLinear(low_rank, features, request_in=rank_request, request_out=out_request)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))  # (B, W) -> (B, low_rank) -> (B, W)

    def flops(self) -> int:
        down = self.down.flops() if isinstance(self.down, MaskedLinear) else 0
        return down + self.up.flops()

    def forward_split(self, x: Split) -> Split:
        h = linear(self.down, x) if isinstance(self.down, MaskedLinear) else x
        return linear(self.up, h)

    def slice_from(self, prefix: str, widest: CrossMap, in_pos: InPos, take: Take) -> Params:
        """Low rank (``W = U Vᵀ``): the first ``rank`` units of ``U`` and ``V``; full: ``W`` on ``in_pos``."""
        if not isinstance(self.down, MaskedLinear):
            return slice_linear(f"{prefix}up.", widest.up, in_pos, in_pos, take)
        rank = self.down.out_features
        return {**slice_linear(f"{prefix}down.", widest.down, rank, in_pos, take),
                **slice_linear(f"{prefix}up.", widest.up, in_pos, rank, take)}


@register_block("dcn")
class DCN(Block):
    """Stacked DCNv2 cross layers: explicit bounded-degree feature crosses.

    Paper: DCN V2, Wang et al., WWW'21, arXiv 2008.13535.

    Update rule: :math:`x_{l+1} = x_0 \\odot (W_l x_l + b_l) + x_l`, with :math:`W_l = U_l V_l^T`
    when ``low_rank > 0``.

    ROCS masking: every ``W_l`` (or both ``U_l`` and ``V_l``) is block lower triangular, so the first
    ``request_in`` output units depend only on the first ``request_in`` input units
    (``request_out = request_in``); the products with ``x_0`` and the residual are per unit. Of the
    ``low_rank`` units of ``Vᵀ x`` a proportional share (or ``rocs_share``) are request side.

    Args:
        in_features: width W of the flat input (and of the output).
        num_layers: number of cross layers.
        low_rank: 0 for a full ``W x W`` matrix, else the rank ``r`` of ``U Vᵀ`` (``r <= W``).
        request_in: request-side input units (``None`` = unmasked).
        rocs_share: fraction of the rank units that are request side (``None``: proportional).

    Shapes: ``(B, W) -> (B, W)``.

    >>> block = DCN(8, num_layers=2, low_rank=2)
    >>> block(torch.randn(3, 8)).shape, block.flops()
    (torch.Size([3, 8]), 128)
    """

    in_kind = FLAT
    out_kind = FLAT
    num_inputs = 1

    def __init__(
        self,
        in_features: int,
        *,
        num_layers: int = 2,
        low_rank: int = 0,
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        check_positive("in_features", in_features)
        check_positive("num_layers", num_layers)
        if isinstance(low_rank, bool) or not isinstance(low_rank, int) or not 0 <= low_rank <= in_features:
            raise ValueError(f"low_rank must be an int in [0, in_features={in_features}], got {low_rank!r}")
        check_request(request_in, in_features)
        self.layers = nn.ModuleList(
            CrossMap(in_features, low_rank, request_in, rocs_share) for _ in range(num_layers)
        )
        self.out_shape = (in_features,)
        self.request_out = request_in or 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = x  # (B, W)
        for layer in self.layers:
            x = x0 * layer(x) + x  # (B, W) * (B, W) + (B, W)
        return x

    def flops(self) -> int:
        return sum(layer.flops() for layer in self.layers)

    def forward_split(self, x: Split) -> Split:
        x0 = x
        for layer in self.layers:
            y = layer.forward_split(x)
            x = x.like(x0.req * y.req + x.req, x0.cand * y.cand + x.cand)
        return x

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        params: Params = {}
        for i, layer in enumerate(self.layers):
            params.update(layer.slice_from(f"layers.{i}.", widest.layers[i], in_pos, take))
        return params, in_pos
