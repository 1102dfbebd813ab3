"""``attention``: multi-head self-attention over fields (AutoInt / transformer encoder layer)."""

from __future__ import annotations

import math

import torch
from torch import nn

from rankitect.blocks.base import FIELD, Block, register_block
from rankitect.blocks.common import check_dropout, check_positive, check_request
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_whole
from rankitect.blocks.split import Split, add

FFN_RATIO = 4  # hidden width of the optional feed-forward network, as in the transformer


@register_block("attention")
class Attention(Block):
    """Multi-head self-attention over field embeddings, residual + LayerNorm, optional FFN.

    Paper: AutoInt, Song et al., CIKM'19, arXiv 1810.11921; Transformer, arXiv 1706.03762.

    Update rule: :math:`Y = \\mathrm{LN}(X + \\mathrm{softmax}(QK^T/\\sqrt{d_k})V\\,W_O)`, then
    optionally :math:`Y \\leftarrow \\mathrm{LN}(Y + W_2\\,\\mathrm{relu}(W_1 Y))` (hidden ``4D``).

    Written with explicit matmuls (not ``scaled_dot_product_attention``) so that every product is
    counted by ``torch.utils.flop_counter``. ROCS masking: request queries attend only to request
    keys (masked scores are ``-inf`` before the softmax, so their weights are exactly 0); every
    other step is per field, so the first ``request_out = R`` output fields depend only on the
    request fields.

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D (divisible by ``num_heads``).
        num_heads: number H of heads, each of size ``D / H``.
        ffn: add the two-layer feed-forward sublayer.
        dropout: probability of zeroing each output unit of a sublayer before its residual sum
            (the transformer's residual dropout; training only).
        request_in: request-side input fields (``None`` = unmasked).

    Shapes: ``(B, N, D) -> (B, N, D)``.

    >>> block = Attention(3, 4, num_heads=2, ffn=False)
    >>> block(torch.randn(2, 3, 4)).shape, block.flops()
    (torch.Size([2, 3, 4]), 528)
    """

    in_kind = FIELD
    out_kind = FIELD
    num_inputs = 1
    late_params = ("dropout",)

    def __init__(
        self, in_fields: int, dim: int, *, num_heads: int = 2, ffn: bool = True, dropout: float = 0.0,
        request_in: int | None = None,
    ) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_positive("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads!r}")
        if not isinstance(ffn, bool):
            raise ValueError(f"ffn must be a bool, got {ffn!r}")
        check_request(request_in, in_fields)
        self.dropout = nn.Dropout(check_dropout(dropout))
        self.in_fields, self.dim, self.num_heads = in_fields, dim, num_heads
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
        self.out_shape = (in_fields, dim)
        self.request_out = r

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The multi-head attention sublayer before the residual: ``(B, N, D) -> (B, N, D)``."""
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
        y = self.norm(x + self.dropout(self.attend(x)))  # (B, N, D)
        if self.ffn is not None and self.ffn_norm is not None:
            y = self.ffn_norm(y + self.dropout(self.ffn(y)))  # (B, N, D) -> (B, N, 4D) -> (B, N, D)
        return y

    def forward_split(self, x: Split) -> Split:
        """Request queries see request keys only; candidate queries see the request's K/V, computed once."""
        H, D = self.num_heads, self.dim
        scale = math.sqrt(D // H)
        q_u, k_u, v_u = _heads(self.qkv(x.req), H)  # 3 x (Q, H, R, Dh)
        q_c, k_c, v_c = _heads(self.qkv(x.cand), H)  # 3 x (B, H, C, Dh)
        keys = torch.cat([k_u.index_select(0, x.index), k_c], dim=2)  # (B, H, N, Dh)
        values = torch.cat([v_u.index_select(0, x.index), v_c], dim=2)
        y = x.like(_attend(q_u, k_u, v_u, scale), _attend(q_c, keys, values, scale))
        y = add(x, y.map(self.proj).map(self.dropout)).map(self.norm)
        if self.ffn is not None and self.ffn_norm is not None:
            y = add(y, y.map(self.ffn).map(self.dropout)).map(self.ffn_norm)
        return y

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        # Every weight acts on the embedding dimension only; the field count and heads change no shape.
        params = {**slice_whole("qkv.", widest.qkv, take), **slice_whole("proj.", widest.proj, take),
                  **slice_whole("norm.", widest.norm, take)}
        if self.ffn is not None:
            params.update({**slice_whole("ffn.", widest.ffn, take), **slice_whole("ffn_norm.", widest.ffn_norm, take)})
        return params, in_pos

    def flops(self) -> int:
        N, D = self.in_fields, self.dim
        projections = 2 * N * D * (3 * D) + 2 * N * D * D  # qkv and output projection
        mixing = 2 * (2 * N * N * D)  # QKᵀ and weights @ V over all heads
        ffn = 2 * (2 * N * D * FFN_RATIO * D) if self.ffn is not None else 0
        return projections + mixing + ffn


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    B, N, three_d = t.shape
    # (B, N, 3D) -> (B, N, 3, H, Dh) -> 3 x (B, H, N, Dh)
    return t.reshape(B, N, 3, H, three_d // (3 * H)).permute(2, 0, 3, 1, 4)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # The scale on the queries (n x Dh per head) costs less than on the scores (n x m).
    scores = torch.matmul(q / scale, k.transpose(-1, -2))  # (B, H, n, Dh) @ (B, H, Dh, m) -> (B, H, n, m)
    out = torch.matmul(scores.softmax(dim=-1), v)  # (B, H, n, m) @ (B, H, m, Dh) -> (B, H, n, Dh)
    B, H, n, Dh = out.shape
    return out.transpose(1, 2).reshape(B, n, H * Dh)  # (B, H, n, Dh) -> (B, n, H, Dh) -> (B, n, D)
