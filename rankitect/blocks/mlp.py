"""``mlp``: a stack of fully connected layers on a flat input."""

from __future__ import annotations

import torch
from torch import nn

from rankitect.blocks.base import FLAT, Block, register_block
from rankitect.blocks.common import (
    MaskedLinear,
    check_dropout,
    check_norm,
    check_positive,
    check_request,
    make_activation,
    make_norm,
    request_share,
)
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_affine, slice_linear
from rankitect.blocks.split import Split, sequential


@register_block("mlp")
class MLP(Block):
    """Fully connected layers, each ``Linear -> norm -> activation -> dropout`` (NASRec "FC" op).

    Paper: NASRec, Zhang et al., WWW'23, arXiv 2207.07187 (the dense "FC" block).

    Update rule per layer: :math:`h_{l+1} = \\mathrm{act}(\\mathrm{norm}(W_l h_l + b_l))`.

    ROCS masking: every linear is block lower triangular (request units see only request units);
    the request share of each layer's units is proportional to the input share, or ``rocs_share``;
    the LayerNorm keeps separate statistics for the request units.

    Args:
        in_features: width W of the flat input.
        width: units per layer (the output width).
        num_layers: number of layers.
        activation: ``"relu"``, ``"gelu"``, ``"silu"`` or ``"none"``.
        norm: ``"layernorm"``, ``"batchnorm"`` or ``"none"``.
        dropout: probability of zeroing each unit after each layer's activation (training only).
        request_in: request-side input units (``None`` = unmasked).
        rocs_share: fraction of each masked layer's units that are request side (``None``:
            proportional to its input share).

    Shapes: ``(B, in_features) -> (B, width)``.

    >>> block = MLP(16, width=8, num_layers=2)
    >>> block(torch.randn(4, 16)).shape, block.flops()
    (torch.Size([4, 8]), 384)
    """

    in_kind = FLAT
    out_kind = FLAT
    num_inputs = 1
    late_params = ("dropout",)

    def __init__(
        self,
        in_features: int,
        *,
        width: int,
        num_layers: int = 1,
        activation: str = "relu",
        norm: str = "layernorm",
        dropout: float = 0.0,
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        check_positive("in_features", in_features)
        check_positive("width", width)
        check_positive("num_layers", num_layers)
        check_norm(norm)
        # One module applied after every activation, outside ``layers``: the state-dict names of
        # an MLP without dropout stay what they were.
        self.dropout = nn.Dropout(check_dropout(dropout))
        check_request(request_in, in_features)
        layers: list[nn.Module] = []
        size, request = in_features, request_in
        for _ in range(num_layers):
            out_request = request_share(request, size, width, rocs_share) if request is not None else None
            layers.append(MaskedLinear(size, width, request_in=request, request_out=out_request or 0))
            layers.append(make_norm(norm, width, request_in=out_request))
            layers.append(make_activation(activation))
            size, request = width, out_request
        self.layers = nn.Sequential(*layers)
        self.out_shape = (width,)
        self.request_out = request or 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout.p == 0.0:
            return self.layers(x)  # (B, W) -> (B, width)
        for i in range(0, len(self.layers), 3):  # Linear, norm, activation; then dropout
            x = self.dropout(self.layers[i + 2](self.layers[i + 1](self.layers[i](x))))
        return x

    def flops(self) -> int:
        return sum(m.flops() for m in self.layers if isinstance(m, MaskedLinear))

    def forward_split(self, x: Split) -> Split:
        return sequential(self.layers, x)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        return slice_layers("layers.", widest.layers, self.layers, in_pos, take), torch.arange(self.out_shape[0])


def slice_layers(prefix: str, widest: nn.Sequential, layers: nn.Sequential, in_pos: InPos, take: Take) -> Params:
    """A stack of ``Linear -> norm -> act`` triples: the first layers of the widest, first units.

    The norms share one affine map per unit whatever their kind: a layer norm, a batch norm or
    none takes the weights its own kind has from the widest layer's norm (a layer norm).
    """
    out: Params = {}
    cols = in_pos
    for i in range(0, len(layers), 3):
        width = layers[i].out_features
        out.update(slice_linear(f"{prefix}{i}.", widest[i], width, cols, take))
        out.update(slice_affine(f"{prefix}{i + 1}.", widest[i + 1], width, take, like=layers[i + 1]))
        cols = width
    return out
