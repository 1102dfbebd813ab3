"""``history_cross``: ROCS Deep Cross Attention, the history encoded once per request, each candidate a query."""

from __future__ import annotations

import math

import torch
from torch import nn

from rankitect.blocks.base import FIELD, SEQUENCE, Block, register_block
from rankitect.blocks.common import check_positive
from rankitect.blocks.sequence import History, HistorySplit, MaskedSelfAttention, check_sequence_request, masked_softmax
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_whole
from rankitect.blocks.split import Split


@register_block("history_cross")
class HistoryCross(Block):
    """Deep Cross Attention: a request-side history encoder, then the candidate as the query.

    Paper: ROCS (Meta, arXiv 2607.27744), Deep Cross Attention; Transformer, arXiv 1706.03762.

    Update rule: :math:`H = \\mathrm{LN}(X + \\mathrm{MHA}(X))` over the history :math:`X = [e_i] + P`
    (optional, ``encoder``), :math:`K = H W_K`, :math:`V = H W_V`, and for the candidate ``v``:
    :math:`q = W_Q v`, :math:`u = W_O\\,\\mathrm{softmax}(q K^T / \\sqrt{d_k}) V` over the history's
    valid positions (an empty history gives ``u = W_O 0``, the output bias).

    The encoder and ``K``, ``V`` read the history alone: on ROCS splits they run once per request
    and each candidate pays only its query, ``O(L D)`` instead of the encoder's ``O(L^2 D + L D^2)``.

    Args:
        max_len: history length L.
        dim: embedding dimension D (divisible by ``num_heads``).
        num_heads: attention heads (of the encoder and the cross attention).
        encoder: encode the history with a self-attention layer first (else ``H = X``).
        request_in: ``None`` (unmasked), or ``max_len`` for a request-side history.

    Shapes: ``History(seq (B, L, D), mask (B, L), target (B, D)) -> (B, 1, D)``.

    >>> dca = HistoryCross(3, 4, num_heads=2)
    >>> x = History(torch.randn(2, 3, 4), torch.tensor([[False, True, True], [False] * 3]), torch.randn(2, 4))
    >>> dca(x).shape, bool(torch.isfinite(dca(x)).all()), dca.flops()
    (torch.Size([2, 1, 4]), True, 832)
    """

    in_kind = SEQUENCE
    out_kind = FIELD
    num_inputs = 1
    mixes_fields = False
    uses_target = True

    def __init__(
        self, max_len: int, dim: int, *, num_heads: int = 2, encoder: bool = True, request_in: int | None = None,
    ) -> None:
        super().__init__()
        check_positive("max_len", max_len)
        check_positive("dim", dim)
        check_positive("num_heads", num_heads)
        if not isinstance(encoder, bool):
            raise ValueError(f"encoder must be a bool, got {encoder!r}")
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads!r}")
        check_sequence_request(request_in, max_len)
        self.max_len, self.dim, self.num_heads = max_len, dim, num_heads
        self.position = nn.Parameter(torch.randn(max_len, dim) * 0.02)  # (L, D): a recency per position
        self.encoder = MaskedSelfAttention(dim, num_heads) if encoder else None
        self.kv = nn.Linear(dim, 2 * dim)
        self.query = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.out_shape = (1, dim)
        self.request_out = 0

    def keys_values(self, seq: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The request side: ``(R, L, D), (R, L) -> K, V``, each ``(R, H, L, D / H)``."""
        R, L, D = seq.shape
        h = seq + self.position
        if self.encoder is not None:
            h = self.encoder(h, mask)
        kv = self.kv(h).reshape(R, L, 2, self.num_heads, D // self.num_heads)  # (R, L, 2D) -> (R, L, 2, H, Dh)
        k, v = kv.permute(2, 0, 3, 1, 4)  # -> 2 x (R, H, L, Dh)
        return k, v

    def read(self, target: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The candidate side: the query of ``target`` ``(B, D)`` over ``K``, ``V`` of its request -> ``(B, 1, D)``."""
        B, D = target.shape
        H = self.num_heads
        q = self.query(target).reshape(B, H, 1, D // H)  # (B, D) -> (B, H, 1, Dh)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D // H)  # (B,H,1,Dh) @ (B,H,Dh,L) -> (B,H,1,L)
        weights = masked_softmax(scores, mask[:, None, None, :])
        out = torch.matmul(weights, v).reshape(B, D)  # (B, H, 1, L) @ (B, H, L, Dh) -> (B, H, 1, Dh) -> (B, D)
        return self.proj(out).unsqueeze(1)  # (B, 1, D)

    def forward(self, x: History) -> torch.Tensor:
        k, v = self.keys_values(x.seq, x.mask)
        return self.read(x.target, k, v, x.mask)

    def forward_split(self, x: HistorySplit) -> Split:
        """The encoder and K, V once per request (cached for its candidates); a query per candidate."""
        k, v = self.keys_values(x.seq, x.mask)  # 2 x (Q, H, L, Dh)
        index = x.index  # each candidate reads its request's cached K and V: (Q, ...) -> (B, ...)
        out = self.read(x.target, k.index_select(0, index), v.index_select(0, index), x.mask.index_select(0, index))
        return x.candidate_fields(out)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        # Every weight acts on the embedding dimension (or position) only; without an encoder its weights are left.
        params = slice_whole("", widest, take)
        if self.encoder is None:
            params = {n: p for n, p in params.items() if not n.startswith("encoder.")}
        return params, torch.arange(1)

    @classmethod
    def widest(cls, in_shape: tuple[int, ...], params: dict) -> tuple[tuple[int, ...], dict]:
        return in_shape, {**params, "encoder": True}

    def flops(self) -> int:
        L, D = self.max_len, self.dim
        encoder = self.encoder.flops(L) if self.encoder is not None else 0
        return encoder + 2 * L * D * 2 * D + 2 * D * D + 2 * (2 * L * D) + 2 * D * D
