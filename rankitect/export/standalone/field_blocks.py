"""Standalone twins of the field-input blocks: ``efc``, ``dot``, ``fm``, ``attention``, ``wukong``.

Same constructor arguments, submodule and buffer names and forward math as
:mod:`rankitect.blocks.efc`, :mod:`~rankitect.blocks.dot`, :mod:`~rankitect.blocks.fm`,
:mod:`~rankitect.blocks.attention` and :mod:`~rankitect.blocks.wukong`.
"""

import math

import torch
from torch import nn

from rankitect.export.standalone.flat_blocks import MLP
from rankitect.export.standalone.layers import (
    FieldLinear,
    MaskedLinear,
    SplitLayerNorm,
    request_share,
    residual_share,
)

FFN_RATIO = 4


class EFC(nn.Module):
    """``efc``: a linear map along the field axis: ``(B, N, D) -> (B, out_fields, D)``."""

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
        request_out = request_share(request_in, in_fields, out_fields, rocs_share)
        self.linear = FieldLinear(in_fields, out_fields, request_in=request_in, request_out=request_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def pair_order(in_fields: int, request_in: int | None) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, row-major; request x request pairs first when masked."""
    pairs = [(i, j) for i in range(in_fields) for j in range(i + 1, in_fields)]
    if not request_in:
        return pairs
    return sorted(pairs, key=lambda p: p[1] >= request_in)


class Dot(nn.Module):
    """``dot``: all pairwise inner products of the fields: ``(B, N, D) -> (B, N(N-1)/2)``."""

    def __init__(self, in_fields: int, dim: int, *, request_in: int | None = None) -> None:
        super().__init__()
        index = [i * in_fields + j for i, j in pair_order(in_fields, request_in)]
        self.register_buffer("index", torch.tensor(index, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        gram = torch.bmm(x, x.transpose(1, 2))  # (B, N, D) @ (B, D, N) -> (B, N, N)
        return gram.reshape(B, N * N).index_select(1, self.index)  # (B, N*N) -> (B, P)


def fm_pairs(x: torch.Tensor) -> torch.Tensor:
    """``½[(Σ_i v_i)² − Σ_i v_i²]`` per coordinate: ``(B, N, D) -> (B, D)``."""
    total = x.sum(dim=1)  # (B, D)
    return 0.5 * (total * total - (x * x).sum(dim=1))


class FM(nn.Module):
    """``fm``: field-wise FM ``(B, N, D) -> (B, D)``; masked with ``R >= 2``: ``[FM(request), FM(all)]``."""

    def __init__(self, in_fields: int, dim: int, *, request_in: int | None = None) -> None:
        super().__init__()
        self.split = request_in if request_in is not None and request_in >= 2 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = fm_pairs(x)
        if not self.split:
            return full
        return torch.cat([fm_pairs(x[:, : self.split]), full], dim=1)


class Attention(nn.Module):
    """``attention``: ``LN(X + softmax(QKᵀ/√d) V W_O)``, optional FFN: ``(B, N, D) -> (B, N, D)``."""

    def __init__(
        self, in_fields: int, dim: int, *, num_heads: int = 2, ffn: bool = True, request_in: int | None = None
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.ffn = (
            nn.Sequential(nn.Linear(dim, FFN_RATIO * dim), nn.ReLU(), nn.Linear(FFN_RATIO * dim, dim))
            if ffn
            else None
        )
        self.ffn_norm = nn.LayerNorm(dim) if ffn else None
        r = request_in or 0
        # True where a request query (row < R) would see a candidate key (column >= R).
        blocked = torch.zeros(in_fields, in_fields, dtype=torch.bool)
        blocked[:r, r:] = True
        self.register_buffer("blocked", blocked if r else None, persistent=False)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        H = self.num_heads
        qkv = self.qkv(x).reshape(B, N, 3, H, D // H)  # (B, N, 3D) -> (B, N, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # -> 3 x (B, H, N, Dh)
        # (B, H, N, Dh) @ (B, H, Dh, N) -> (B, H, N, N)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D // H)
        if self.blocked is not None:
            scores = scores.masked_fill(self.blocked, float("-inf"))
        out = torch.matmul(scores.softmax(dim=-1), v)  # (B,H,N,N) @ (B,H,N,Dh) -> (B,H,N,Dh)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))  # (B,H,N,Dh) -> (B,N,H,Dh) -> (B,N,D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x + self.attend(x))
        if self.ffn is not None and self.ffn_norm is not None:
            y = self.ffn_norm(y + self.ffn(y))
        return y


def split_share(total: int, first: int, second: int) -> tuple[int, int]:
    """Split ``total`` request outputs between two parts of sizes ``first`` and ``second``."""
    share = (2 * total * first + first + second) // (2 * (first + second))
    share = min(max(share, total - second, 0), total, first)
    return share, total - share


class FactorizationMachineBlock(nn.Module):
    """Wukong FMB: ``X (Xᵀ Y)`` flattened -> LayerNorm -> MLP -> ``(B, out_fields, D)``."""

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
        self.low_rank, self.out_fields = low_rank, out_fields
        self.y = nn.Parameter(torch.zeros(in_fields, low_rank))
        r = request_in or 0
        rank_request = request_share(request_in, in_fields, low_rank, rocs_share)
        y_mask = torch.ones(in_fields, low_rank)
        y_mask[r:, :rank_request] = 0.0
        self.register_buffer("y_mask", y_mask if request_in is not None else None, persistent=False)
        # Row-major positions of Z (N, k); the request entries Z[:R, :rank_request] go first.
        first = [i * low_rank + c for i in range(r) for c in range(rank_request)]
        rest = sorted(set(range(in_fields * low_rank)) - set(first))
        self.register_buffer("order", torch.tensor(first + rest, dtype=torch.long), persistent=False)
        flat_request = len(first) if request_in is not None else None
        self.norm = SplitLayerNorm(in_fields * low_rank, request_in=flat_request)
        self.mlp = None
        hidden, hidden_request = in_fields * low_rank, flat_request
        if mlp_layers:
            self.mlp = MLP(in_fields * low_rank, width=mlp_width, num_layers=mlp_layers, norm="none",
                           request_in=flat_request, rocs_share=rocs_share)
            hidden, hidden_request = mlp_width, self.mlp.request_out
        self.out = MaskedLinear(
            hidden, out_fields * dim, request_in=hidden_request if request_in is not None else None,
            request_out=request_out * dim,
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


class Wukong(nn.Module):
    """``wukong``: ``LN([FMB(X), LCB(X)] + residual(X))``: ``(B, N, D) -> (B, fmb_fields + lcb_fields, D)``."""

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
        out_fields = fmb_fields + lcb_fields
        request_out = residual_share(request_in, in_fields, out_fields, rocs_share)
        self.fmb_request, self.lcb_request = split_share(request_out, fmb_fields, lcb_fields)
        self.fmb = FactorizationMachineBlock(
            in_fields, dim, fmb_fields, low_rank, mlp_width, mlp_layers, request_in, self.fmb_request,
            rocs_share=rocs_share,
        )
        self.lcb = FieldLinear(in_fields, lcb_fields, bias=False, request_in=request_in, request_out=self.lcb_request)
        self.residual = None
        if in_fields != out_fields:
            self.residual = FieldLinear(
                in_fields, out_fields, bias=False, request_in=request_in, request_out=request_out
            )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fmb, lcb = self.fmb(x), self.lcb(x)  # (B, fmb_fields, D), (B, lcb_fields, D)
        f, c = self.fmb_request, self.lcb_request
        # Request fields of both parts first: (B, fmb_fields + lcb_fields, D).
        out = torch.cat([fmb[:, :f], lcb[:, :c], fmb[:, f:], lcb[:, c:]], dim=1)
        shortcut = x if self.residual is None else self.residual(x)
        return self.norm(out + shortcut)
