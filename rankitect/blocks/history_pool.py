"""``history_pool``: the masked mean (or sum) of a user's history embeddings."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FIELD, SEQUENCE, Block, register_block
from rankitect.blocks.common import check_positive
from rankitect.blocks.sequence import History, HistorySplit, check_sequence_request
from rankitect.blocks.slicing import InPos, Params, Take, pick
from rankitect.blocks.split import Split

MODES = ("mean", "sum")


@register_block("history_pool")
class HistoryPool(Block):
    """Masked pooling of the history: one field summing up what the user did before.

    Paper: YouTube DNN, Covington et al., RecSys'16 (the average of watched-video embeddings).

    Update rule: :math:`u = \\sum_i m_i e_i` (``sum``) or :math:`u = \\sum_i m_i e_i / \\max(1, \\sum_i m_i)`
    (``mean``), over the history positions ``i`` with mask ``m_i``; an empty history gives ``u = 0``.

    It reads the history alone (not the candidate), so under ROCS masking its output is request
    side (``request_out = 1`` when the history is): it runs once per request.

    Args:
        max_len: history length L (positions, pads included).
        dim: embedding dimension D.
        mode: ``"mean"`` or ``"sum"``.
        request_in: ``None`` (unmasked), or ``max_len`` for a request-side history.

    Shapes: ``History(seq (B, L, D), mask (B, L), target (B, D)) -> (B, 1, D)``.

    >>> pool = HistoryPool(3, 2)
    >>> seq = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]] * 2)
    >>> mask = torch.tensor([[False, True, True], [False, False, False]])
    >>> pool(History(seq, mask, torch.zeros(2, 2))).tolist(), pool.flops()
    ([[[4.0, 5.0]], [[0.0, 0.0]]], 0)
    """

    in_kind = SEQUENCE
    out_kind = FIELD
    num_inputs = 1
    mixes_fields = False

    def __init__(self, max_len: int, dim: int, *, mode: str = "mean", request_in: int | None = None) -> None:
        super().__init__()
        check_positive("max_len", max_len)
        check_positive("dim", dim)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        self.max_len, self.dim, self.mode = max_len, dim, mode
        request = check_sequence_request(request_in, max_len)
        self.out_shape = (1, dim)
        self.request_out = 1 if request else 0

    def pool(self, seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, L, D), (B, L) -> (B, 1, D)``."""
        keep = mask.unsqueeze(-1).to(seq.dtype)  # (B, L, 1)
        total = (seq * keep).sum(dim=1, keepdim=True)  # (B, 1, D)
        if self.mode == "sum":
            return total
        return total / keep.sum(dim=1, keepdim=True).clamp(min=1.0)

    def forward(self, x: History) -> torch.Tensor:
        return self.pool(x.seq, x.mask)

    def forward_split(self, x: HistorySplit) -> Split:
        """Once per request: the history alone decides the output."""
        pooled = self.pool(x.seq, x.mask)  # (Q, 1, D)
        if self.request_out:
            return x.request_fields(pooled)
        return x.candidate_fields(pooled.index_select(0, x.index))

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        return {}, torch.arange(1)  # no weights

    def flops(self) -> int:
        return 0  # elementwise work only
