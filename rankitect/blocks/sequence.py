"""The third tensor kind: a history, and the pieces the history blocks share.

A history block (``in_kind = "sequence"``) takes one :class:`History`: the embeddings of a user's
earlier items ``seq`` ``(B, L, D)``, right-aligned (pads first, the latest item at position
``L - 1``, so a position means a recency), their ``mask`` ``(B, L)`` (``False`` on pads), and the
``target`` ``(B, D)``, the embedding of the candidate item the history is read for (the sparse
field the history shares its table with). It gives a field ``(B, N, D)`` tensor like other blocks.

On ROCS splits (:mod:`rankitect.blocks.split`) a history is request side: :class:`HistorySplit`
holds ``seq`` and ``mask`` once per request and the ``target`` once per candidate, so a block
encodes the history once per request and lets each candidate read it.

Every softmax over history positions goes through :func:`masked_softmax`, which gives zero weights
(no NaN, in the forward or the backward) to a row with no valid position: an empty history.
Imports only torch, so the exporter can bundle it with the blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from rankitect.blocks.split import Split


class History(NamedTuple):
    """A history block's input: ``seq`` ``(B, L, D)``, ``mask`` ``(B, L)`` bool, ``target`` ``(B, D)``."""

    seq: torch.Tensor
    mask: torch.Tensor
    target: torch.Tensor


@dataclass(frozen=True)
class HistorySplit:
    """A history on ROCS splits: ``seq`` ``(Q, L, D)`` and ``mask`` ``(Q, L)`` once per request,
    ``target`` ``(B, D)`` per candidate; ``index`` ``(B,)`` is each candidate's request row and
    ``first`` ``(Q,)`` one candidate row of each request (as in :class:`~rankitect.blocks.split.Split`)."""

    seq: torch.Tensor
    mask: torch.Tensor
    target: torch.Tensor
    index: torch.Tensor
    first: torch.Tensor

    def full(self) -> History:
        """The per-candidate :class:`History` (the request part broadcast)."""
        return History(self.seq.index_select(0, self.index), self.mask.index_select(0, self.index), self.target)

    def request_fields(self, out: torch.Tensor) -> Split:
        """A request-side output ``(Q, N, D)`` as a split with no candidate fields."""
        return Split(out, out.new_zeros(self.index.shape[0], 0, *out.shape[2:]), self.index, self.first)

    def candidate_fields(self, out: torch.Tensor) -> Split:
        """A per-candidate output ``(B, N, D)`` as a split with no request fields."""
        return Split(out.new_zeros(self.first.shape[0], 0, *out.shape[2:]), out, self.index, self.first)


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` over its last axis where ``keep`` (broadcastable, bool) holds; 0 elsewhere.

    A row with nothing to keep gets all-zero weights: its scores are set to 0 before the softmax
    (so nothing is ``-inf`` everywhere) and the weights multiplied by ``keep`` after.

    >>> w = masked_softmax(torch.tensor([[1.0, 1.0, 5.0], [2.0, 3.0, 4.0]]),
    ...                    torch.tensor([[True, True, False], [False, False, False]]))
    >>> w.tolist()
    [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    """
    keep = keep.expand_as(scores)
    some = keep.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~some, 0.0)
    return scores.softmax(dim=-1) * keep


class MaskedSelfAttention(nn.Module):
    """Multi-head self-attention over tokens with a key mask, residual and LayerNorm:
    ``Y = LN(X + softmax(QKᵀ/√d_k) V W_O)`` (masked keys get weight 0).

    Written with explicit matmuls so that ``torch.utils.flop_counter`` counts every product:
    ``2 N D (3D) + 2 N D D`` for the projections and ``2 (2 N N D)`` for the mixing.

    >>> att = MaskedSelfAttention(4, 2)
    >>> att(torch.randn(2, 3, 4), torch.tensor([[True, True, False], [False, False, False]])).shape
    torch.Size([2, 3, 4])
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads!r}")
        self.dim, self.num_heads = dim, num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.mix(self.qkv(x), x, keep)

    def mix(self, qkv: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The layer from its projections ``qkv`` ``(B, N, 3D)`` (computed once where they can be)."""
        B, N, D = x.shape
        H = self.num_heads
        q, k, v = qkv.reshape(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)  # (B, N, 3D) -> 3 x (B, H, N, Dh)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D // H)  # (B, H, N, Dh) @ (B, H, Dh, N)
        weights = masked_softmax(scores, keep[:, None, None, :])  # (B, H, N, N)
        out = torch.matmul(weights, v)  # (B, H, N, N) @ (B, H, N, Dh) -> (B, H, N, Dh)
        return self.norm(x + self.proj(out.transpose(1, 2).reshape(B, N, D)))  # (B, H, N, Dh) -> (B, N, D)

    def flops(self, tokens: int) -> int:
        N, D = tokens, self.dim
        return 2 * N * D * 3 * D + 2 * N * D * D + 2 * (2 * N * N * D)


def check_sequence_request(request_in: int | None, max_len: int) -> int | None:
    """A history block's ``request_in``: ``None`` (unmasked), or ``max_len`` (its history is request
    side) or 0 (candidate side); anything else is a ``ValueError``."""
    if request_in is None or (type(request_in) is int and request_in in (0, max_len)):
        return request_in
    raise ValueError(f"request_in of a history block must be None, 0 or max_len={max_len}, got {request_in!r}")


__all__ = ["History", "HistorySplit", "MaskedSelfAttention", "check_sequence_request", "masked_softmax"]
