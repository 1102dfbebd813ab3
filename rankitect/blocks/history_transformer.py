"""``history_transformer``: BST's transformer layer over the history and the candidate item."""

from __future__ import annotations

import torch
from torch import nn

from rankitect.blocks.attention import FFN_RATIO
from rankitect.blocks.base import FIELD, SEQUENCE, Block, register_block
from rankitect.blocks.common import check_positive
from rankitect.blocks.sequence import History, HistorySplit, MaskedSelfAttention, check_sequence_request
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_whole
from rankitect.blocks.split import Split


@register_block("history_transformer")
class HistoryTransformer(Block):
    """One transformer layer over ``[history; candidate]`` with a position (recency) embedding.

    Paper: Behavior Sequence Transformer, Chen et al., DLP-KDD'19, arXiv 1905.06874.

    Update rule: :math:`X = [e_1 .. e_L; v] + P`,
    :math:`Y = \\mathrm{LN}(X + \\mathrm{MHA}(X))`, :math:`Z = \\mathrm{LN}(Y + W_2\\,\\mathrm{relu}(W_1 Y))`
    (hidden ``4D``), with pad positions masked out of the keys and their outputs set to 0. ``P`` is
    learned per position; histories are right-aligned, so a position is a recency (BST's time gap).

    Every output token sees the candidate, so the output is candidate side. On ROCS splits the
    history tokens' query, key and value projections run once per request.

    Args:
        max_len: history length L.
        dim: embedding dimension D (divisible by ``num_heads``).
        num_heads: attention heads.
        request_in: ``None`` (unmasked), or ``max_len`` for a request-side history.

    Shapes: ``History(seq (B, L, D), mask (B, L), target (B, D)) -> (B, L + 1, D)`` (the candidate's
    token last).

    >>> bst = HistoryTransformer(3, 4, num_heads=2)
    >>> x = History(torch.randn(2, 3, 4), torch.tensor([[False, True, True], [False] * 3]), torch.randn(2, 4))
    >>> out = bst(x)
    >>> out.shape, bool((out[1, :3] == 0).all()), bst.flops()
    (torch.Size([2, 4, 4]), True, 1792)
    """

    in_kind = SEQUENCE
    out_kind = FIELD
    num_inputs = 1
    mixes_fields = False
    uses_target = True

    def __init__(self, max_len: int, dim: int, *, num_heads: int = 2, request_in: int | None = None) -> None:
        super().__init__()
        check_positive("max_len", max_len)
        check_positive("dim", dim)
        check_positive("num_heads", num_heads)
        check_sequence_request(request_in, max_len)
        self.max_len, self.dim, self.num_heads = max_len, dim, num_heads
        self.position = nn.Parameter(torch.randn(max_len + 1, dim) * 0.02)  # (L + 1, D)
        self.attention = MaskedSelfAttention(dim, num_heads)
        self.ffn = nn.Sequential(nn.Linear(dim, FFN_RATIO * dim), nn.ReLU(), nn.Linear(FFN_RATIO * dim, dim))
        self.ffn_norm = nn.LayerNorm(dim)
        self.out_shape = (max_len + 1, dim)
        self.request_out = 0

    def forward(self, x: History) -> torch.Tensor:
        tokens = torch.cat([x.seq, x.target.unsqueeze(1)], dim=1) + self.position  # (B, L + 1, D)
        return self.layer(self.attention.qkv(tokens), tokens, x.mask)

    def layer(self, qkv: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The layer from the tokens' projections ``qkv`` ``(B, L + 1, 3D)``; pads' outputs are 0."""
        keep = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (B, L + 1): the candidate always
        y = self.attention.mix(qkv, tokens, keep)
        z = self.ffn_norm(y + self.ffn(y))  # (B, L+1, D) -> (B, L+1, 4D) -> (B, L+1, D)
        return z * keep.unsqueeze(-1).to(z.dtype)

    def forward_split(self, x: HistorySplit) -> Split:
        """The history tokens' projections once per request; the candidate's token and the layer per candidate."""
        seq = x.seq + self.position[:-1]  # (Q, L, D)
        hist_qkv = self.attention.qkv(seq).index_select(0, x.index)  # (Q, L, 3D) -> (B, L, 3D)
        cand = (x.target + self.position[-1]).unsqueeze(1)  # (B, 1, D)
        qkv = torch.cat([hist_qkv, self.attention.qkv(cand)], dim=1)  # (B, L + 1, 3D)
        tokens = torch.cat([seq.index_select(0, x.index), cand], dim=1)
        return x.candidate_fields(self.layer(qkv, tokens, x.mask.index_select(0, x.index)))

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        # Every weight acts on the embedding dimension (or position) only: nothing is cut.
        return slice_whole("", widest, take), torch.arange(self.out_shape[0])

    def flops(self) -> int:
        N, D = self.max_len + 1, self.dim
        return self.attention.flops(N) + 2 * (2 * N * D * FFN_RATIO * D)
