"""Standalone twins of the flat-input blocks: ``mlp``, ``dcn``, ``gating``, ``sum``.

Same constructor arguments, submodule names and forward math as :mod:`rankitect.blocks.mlp`,
:mod:`~rankitect.blocks.dcn`, :mod:`~rankitect.blocks.gating` and :mod:`~rankitect.blocks.sum_block`.
"""

import torch
from torch import nn

from rankitect.export.standalone.layers import ACTIVATIONS, MaskedLinear, make_norm, request_share


class MLP(nn.Module):
    """``mlp``: layers of ``Linear -> norm -> activation``: ``(B, in_features) -> (B, width)``."""

    def __init__(
        self,
        in_features: int,
        *,
        width: int,
        num_layers: int = 1,
        activation: str = "relu",
        norm: str = "layernorm",
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size, request = in_features, request_in
        for _ in range(num_layers):
            out_request = request_share(request, size, width, rocs_share) if request is not None else None
            layers.append(MaskedLinear(size, width, request_in=request, request_out=out_request or 0))
            layers.append(make_norm(norm, width, request_in=out_request))
            layers.append(ACTIVATIONS[activation]())
            size, request = width, out_request
        self.layers = nn.Sequential(*layers)
        self.request_out = request or 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CrossMap(nn.Module):
    """``W x + b`` of one cross layer: full ``W`` or ``W = U Vᵀ`` of rank ``low_rank``."""

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
        return self.up(self.down(x))


class DCN(nn.Module):
    """``dcn``: DCNv2 cross layers ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``: ``(B, W) -> (B, W)``."""

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
        self.layers = nn.ModuleList(
            CrossMap(in_features, low_rank, request_in, rocs_share) for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = x
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x


class Gating(nn.Module):
    """``gating``: ``P (right * sigmoid(W left))``: ``(B, L), (B, R) -> (B, width)``."""

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
        left_r, right_r = request_in if request_in is not None else (None, None)
        gated_r = right_r if left_r is not None else None
        self.gate = MaskedLinear(left_features, right_features, request_in=left_r, request_out=gated_r or 0)
        request_out = request_share(gated_r, right_features, width, rocs_share)
        self.proj = MaskedLinear(right_features, width, request_in=gated_r, request_out=request_out)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return self.proj(right * torch.sigmoid(self.gate(left)))


class Sum(nn.Module):
    """``sum``: ``relu(P_l left + P_r right + b)``: ``(B, L), (B, R) -> (B, width)``."""

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
        left_r, right_r = request_in if request_in is not None else (None, None)
        masked = left_r is not None and right_r is not None
        both = left_features + right_features
        out_r = request_share(left_r + right_r, both, width, rocs_share) if masked else 0
        self.left = MaskedLinear(left_features, width, request_in=left_r, request_out=out_r)
        self.right = MaskedLinear(right_features, width, bias=False, request_in=right_r, request_out=out_r)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(left) + self.right(right))
