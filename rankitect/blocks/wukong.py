"""``wukong``: one Wukong layer (factorization machine block + linear compress block)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rankitect.blocks.base import FIELD, Block, register_block
from rankitect.blocks.common import (
    FieldLinear,
    MaskedLinear,
    SplitLayerNorm,
    check_positive,
    check_request,
    request_share,
    residual_share,
)
from rankitect.blocks.mlp import MLP
from rankitect.blocks.slicing import (
    Index,
    InPos,
    Params,
    Take,
    pick,
    prefixed,
    slice_affine,
    slice_linear,
    slice_whole,
)
from rankitect.blocks.split import Split, add, cat, field_linear, linear, split_layer_norm


def split_share(total: int, first: int, second: int) -> tuple[int, int]:
    """Split ``total`` request outputs between two parts of sizes ``first`` and ``second``.

    >>> split_share(4, 4, 4), split_share(1, 4, 4), split_share(5, 2, 8)
    ((2, 2), (1, 0), (1, 4))
    """
    share = (2 * total * first + first + second) // (2 * (first + second))
    share = min(max(share, total - second, 0), total, first)
    return share, total - share


class FactorizationMachineBlock(nn.Module):
    """Wukong FMB: ``X (Xᵀ Y)`` flattened -> LayerNorm -> MLP -> ``(B, out_fields, D)``.

    Masked, the first ``rank_request`` columns of ``Y`` are zero on candidate rows, so the entries
    ``Z[:R, :rank_request]`` of ``Z = X (Xᵀ Y)`` depend only on request fields; they are moved to
    the front of the flattened vector, and the LayerNorm, the MLP and the output layer are masked
    from there on, ending in ``request_out`` request fields.
    """

    def __init__(
        self,
        in_fields: int,
        dim: int,
        out_fields: int,
        low_rank: int,
        mlp_width: int,
        mlp_layers: int,
        request_in: int | None,
        request_out: int,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        self.in_fields, self.dim, self.low_rank, self.out_fields = in_fields, dim, low_rank, out_fields
        self.y = nn.Parameter(torch.randn(in_fields, low_rank) / in_fields**0.5)
        r = request_in or 0
        self.rank_request = rank_request = request_share(request_in, in_fields, low_rank, rocs_share)
        y_mask = torch.ones(in_fields, low_rank)
        y_mask[r:, :rank_request] = 0.0
        self.register_buffer("y_mask", y_mask if request_in is not None else None, persistent=False)
        # Row-major positions of Z (N, k); the request entries Z[:R, :rank_request] go first.
        first = [i * low_rank + c for i in range(r) for c in range(rank_request)]
        rest = sorted(set(range(in_fields * low_rank)) - set(first))
        self.register_buffer("order", torch.tensor(first + rest, dtype=torch.long), persistent=False)
        flat_request = len(first) if request_in is not None else None
        self.norm = SplitLayerNorm(in_fields * low_rank, request_in=flat_request)
        self.mlp = (
            MLP(in_fields * low_rank, width=mlp_width, num_layers=mlp_layers, norm="none",
                request_in=flat_request, rocs_share=rocs_share)
            if mlp_layers
            else None
        )
        hidden = mlp_width if self.mlp is not None else in_fields * low_rank
        hidden_request = flat_request if self.mlp is None else self.mlp.request_out
        if request_in is None:
            hidden_request = None
        self.out = MaskedLinear(
            hidden, out_fields * dim, request_in=hidden_request, request_out=request_out * dim
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        y = self.y if self.y_mask is None else self.y * self.y_mask
        xty = torch.matmul(x.transpose(1, 2), y)  # (B, D, N) @ (N, k) -> (B, D, k)
        z = torch.matmul(x, xty)  # (B, N, D) @ (B, D, k) -> (B, N, k)
        h = self.norm(z.reshape(B, N * self.low_rank).index_select(1, self.order))  # (B, N*k)
        if self.mlp is not None:
            h = self.mlp(h)
        return self.out(h).reshape(B, self.out_fields, D)  # (B, out_fields*D) -> (B, out_fields, D)

    def flops(self) -> int:
        interaction = 2 * (2 * self.in_fields * self.dim * self.low_rank)  # Xᵀ Y and X (Xᵀ Y)
        return interaction + (self.mlp.flops() if self.mlp else 0) + self.out.flops()

    def forward_split(self, x: Split) -> Split:
        """``Z = X (Xᵀ Y)`` with the request entries ``Z[:R, :kr]`` once per request."""
        R, D, kr = x.request_width, self.dim, self.rank_request
        y = self.y if self.y_mask is None else self.y * self.y_mask  # (N, k); y[R:, :kr] == 0
        u, c = x.req, x.cand
        xty_u = torch.matmul(u.transpose(1, 2), y[:R])  # (Q, D, R) @ (R, k) -> (Q, D, k)
        # Xᵀ Y of the candidate columns: request rows' share (per request) + candidate rows' share
        xty_c = torch.matmul(c.transpose(1, 2), y[R:, kr:]) + xty_u[..., kr:].index_select(0, x.index)  # (B, D, k-kr)
        z_req = torch.matmul(u, xty_u[..., :kr])  # (Q, R, D) @ (Q, D, kr) -> (Q, R, kr)
        z_uc = torch.matmul(u.index_select(0, x.index), xty_c)  # (B, R, D) @ (B, D, k-kr) -> (B, R, k-kr)
        xty_all = torch.cat([xty_u[..., :kr].index_select(0, x.index), xty_c], dim=2)  # (B, D, k)
        z_c = torch.matmul(c, xty_all)  # (B, C, D) @ (B, D, k) -> (B, C, k)
        # Row-major over (field, column) without the request entries: the block's flat order.
        h = x.like(z_req.flatten(1), torch.cat([z_uc.flatten(1), z_c.flatten(1)], dim=1))
        h = split_layer_norm(self.norm, h)
        if self.mlp is not None:
            h = self.mlp.forward_split(h)
        return linear(self.out, h).fields(D)  # (., r*D) -> (., r, D)

    def slice_from(self, wide: FactorizationMachineBlock, in_pos: torch.Tensor, take: Take) -> Params:
        """The first ``low_rank`` columns of ``Y`` on ``in_pos``, then the norm, MLP and output layer."""
        k, dim = self.low_rank, self.dim
        # Z = X (X^T Y) is (N, k) flattened row-major: widest unit of (field p, rank c) is p * K + c.
        z_pos = (in_pos[:, None] * wide.low_rank + torch.arange(k)).reshape(-1)  # (N, 1) + (k,) -> (N*k,)
        if self.mlp is None and wide.mlp is not None:
            raise ValueError("supernet: a wukong layer without FMB MLP layers cannot share the widest one's weights")
        params: Params = {"y": take(wide.y, in_pos, k), **slice_affine("norm.", wide.norm, z_pos, take)}
        hidden: Index = z_pos
        if self.mlp is not None:
            params.update(prefixed("mlp.", self.mlp.slice_from(wide.mlp, z_pos, take)[0]))
            hidden = self.mlp.out_shape[0]
        params.update(slice_linear("out.", wide.out, self.out_fields * dim, hidden, take))
        return params


@register_block("wukong")
class Wukong(Block):
    """One Wukong layer: FMB and LCB side by side, concatenated, plus residual, LayerNorm.

    Paper: Wukong, Zhang et al., ICML'24, arXiv 2403.02545.

    Update rule: :math:`X_{l+1} = \\mathrm{LN}([\\mathrm{FMB}(X_l), \\mathrm{LCB}(X_l)] + X_l W_{res})`,
    :math:`\\mathrm{FMB}(X) = \\mathrm{MLP}(\\mathrm{LN}(\\mathrm{flat}(X (X^T Y))))`,
    :math:`\\mathrm{LCB}(X) = W_L X`.

    The residual is the identity when ``N = fmb_fields + lcb_fields``, else a linear map along the
    fields. The FMB MLP has ``mlp_layers`` hidden ReLU layers of ``mlp_width`` and a linear output
    to ``fmb_fields * D``. ROCS masking: ``request_out`` (share of ``N'`` proportional to ``R / N``,
    or ``rocs_share`` of ``N'``; ``R`` itself when the residual is the identity) is split between the
    FMB and LCB outputs; each part is masked (see ``FactorizationMachineBlock``, LCB and residual
    are block-lower-triangular field maps) and the request fields of both parts are placed first;
    the final LayerNorm is per field. ``rocs_share`` also sets the request share of the FM's rank
    columns and of the FMB MLP's layers.

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        fmb_fields: fields produced by the FMB.
        lcb_fields: fields produced by the LCB.
        low_rank: columns k of the learned ``Y`` (N, k) of the low-rank FM.
        mlp_width: width of the FMB hidden layers.
        mlp_layers: number of FMB hidden layers (0: one linear map).
        request_in: request-side input fields (``None`` = unmasked).
        rocs_share: fraction of each masked layer's outputs that are request side (``None``:
            proportional to its input share).

    Shapes: ``(B, N, D) -> (B, fmb_fields + lcb_fields, D)``.

    >>> block = Wukong(4, 8, fmb_fields=2, lcb_fields=2, low_rank=3, mlp_width=8, mlp_layers=1, request_in=2)
    >>> block(torch.randn(5, 4, 8)).shape, block.request_out, block.flops()
    (torch.Size([5, 4, 8]), 2, 960)
    """

    in_kind = FIELD
    out_kind = FIELD
    num_inputs = 1

    def __init__(
        self,
        in_fields: int,
        dim: int,
        *,
        fmb_fields: int = 8,
        lcb_fields: int = 8,
        low_rank: int = 8,
        mlp_width: int = 64,
        mlp_layers: int = 2,
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        sizes = {"in_fields": in_fields, "dim": dim, "fmb_fields": fmb_fields, "lcb_fields": lcb_fields}
        for name, value in {**sizes, "low_rank": low_rank, "mlp_width": mlp_width}.items():
            check_positive(name, value)
        if isinstance(mlp_layers, bool) or not isinstance(mlp_layers, int) or mlp_layers < 0:
            raise ValueError(f"mlp_layers must be an int >= 0, got {mlp_layers!r}")
        check_request(request_in, in_fields)
        out_fields = fmb_fields + lcb_fields
        self.request_out = residual_share(request_in, in_fields, out_fields, rocs_share)
        self.fmb_request, self.lcb_request = split_share(self.request_out, fmb_fields, lcb_fields)
        self.fmb = FactorizationMachineBlock(
            in_fields, dim, fmb_fields, low_rank, mlp_width, mlp_layers, request_in, self.fmb_request,
            rocs_share=rocs_share,
        )
        self.lcb = FieldLinear(
            in_fields, lcb_fields, bias=False, request_in=request_in, request_out=self.lcb_request
        )
        self.residual = None
        if in_fields != out_fields:
            self.residual = FieldLinear(
                in_fields, out_fields, bias=False, request_in=request_in, request_out=self.request_out
            )
        self.norm = nn.LayerNorm(dim)
        self.dim = dim
        self.out_shape = (out_fields, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, fmb_fields + lcb_fields, D)
        fmb, lcb = self.fmb(x), self.lcb(x)  # (B, fmb_fields, D), (B, lcb_fields, D)
        f, c = self.fmb_request, self.lcb_request
        # Request fields of both parts first: (B, fmb_fields + lcb_fields, D).
        out = torch.cat([fmb[:, :f], lcb[:, :c], fmb[:, f:], lcb[:, c:]], dim=1)
        shortcut = x if self.residual is None else self.residual(x)
        return self.norm(out + shortcut)

    def flops(self) -> int:
        res = self.residual.field_flops(self.dim) if self.residual is not None else 0
        return self.fmb.flops() + self.lcb.field_flops(self.dim) + res

    def forward_split(self, x: Split) -> Split:
        fmb, lcb = self.fmb.forward_split(x), field_linear(self.lcb, x)
        out = cat([fmb, lcb])  # request fields of both parts first, as the block orders them
        shortcut = x if self.residual is None else field_linear(self.residual, x)
        return add(out, shortcut).map(self.norm)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        params = prefixed("fmb.", self.fmb.slice_from(widest.fmb, in_pos, take))
        f, c = self.fmb.out_fields, self.lcb.out_features
        out_pos = torch.cat([torch.arange(f), widest.fmb.out_fields + torch.arange(c)])  # FMB fields, then LCB
        params.update(slice_linear("lcb.", widest.lcb, c, in_pos, take))
        if self.residual is not None:
            params.update(slice_linear("residual.", widest.residual, out_pos, in_pos, take))
        params.update(slice_whole("norm.", widest.norm, take))
        return params, out_pos

    @classmethod
    def widest(cls, in_shape: tuple[int, ...], params: Mapping[str, Any]) -> tuple[tuple[int, ...], dict]:
        """A residual exists only when the input field count differs from the output's: a widest
        layer whose counts agree gets one spare input field (never filled), so that narrower
        layers, whose counts differ, find the residual's weights."""
        if in_shape[0] == params["fmb_fields"] + params["lcb_fields"]:
            in_shape = (in_shape[0] + 1, *in_shape[1:])
        return in_shape, dict(params)
