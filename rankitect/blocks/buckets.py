"""``buckets``: each dense feature a field of its own, the embedding of its quantile bucket."""

from __future__ import annotations

import torch
from torch import nn

from rankitect.blocks.base import FIELD, FLAT, Block, register_block
from rankitect.blocks.common import check_positive, check_request
from rankitect.blocks.slicing import InPos, Params, Take, pick

BUCKETS = 16  # buckets per feature, the default
EDGE_ROWS = 16_384  # training rows a training sets the edges from (all of a smaller split)


def bucket_edges(x: torch.Tensor, bins: int) -> torch.Tensor:
    """``(n, bins - 1)`` edges for the columns of ``x`` ``(B, n)``: their quantiles at ``k / bins``.

    A column whose minimum holds more than half of the rows (a count that is mostly 0) gets that
    minimum as a bucket of its own (the first edge halfway to the next value), and its other
    ``bins - 1`` buckets are the quantiles of the values above it; a constant column puts every row
    in one bucket.

    >>> bucket_edges(torch.tensor([[0.0], [0.0], [0.0], [1.0], [3.0]]), 3).flatten().tolist()
    [0.5, 2.0]
    """
    x = x.detach().float()
    q = torch.arange(1, bins, dtype=torch.float32) / bins
    out = torch.quantile(x, q, dim=0).T.contiguous()  # (n, bins - 1)
    low = x.min(dim=0).values
    for j in range(x.shape[1]):
        col = x[:, j]
        above = col[col > low[j]]
        if (col == low[j]).float().mean() > 0.5 and len(above):
            rest = torch.quantile(above, torch.arange(1, bins - 1, dtype=torch.float32) / (bins - 1))
            out[j] = torch.cat([((low[j] + above.min()) / 2).reshape(1), rest])
    return out


@register_block("buckets")
class Buckets(Block):
    """Per-feature quantile buckets of a flat input, each embedded: ``(B, n) -> (B, n, D)``.

    Dense features enter the field stream one field each, as the learned embedding of the quantile
    bucket their value falls in: a piecewise-constant encoding, which lets a model use a count whose
    effect is a threshold (the bucketized count features of click models; the quantile encodings of
    Gorishniy et al., NeurIPS'22, arXiv 2203.05556). Embedding lookups cost no FLOPs.

    The edges are data-dependent initialization (as ActNorm's, Glow, arXiv 1807.03039): the first
    forward in training mode sets them to the quantiles of its batch (:func:`bucket_edges`) and they
    stay fixed after that. Trainings make that first forward one of ``EDGE_ROWS`` shuffled training
    rows, without a step (:func:`~rankitect.train.loop.set_bucket_edges`), so the quantiles are
    those of the data rather than of one mini-batch. They are buffers, so a state dict carries them;
    before they are set every value falls in the bucket of its sign. The table is an
    ``nn.Embedding``, so training steps it with the embedding tables' optimizer.

    ROCS masking: feature ``j`` gives field ``j``, so the first ``request_out = request_in`` fields
    depend only on the request-side features.

    Args:
        in_features: number n of dense features (the flat input's width).
        dim: embedding dimension D of the output fields (the architecture's).
        bins: buckets per feature.
        request_in: request-side input features (``None`` = unmasked).

    Shapes: ``(B, n) -> (B, n, D)``.

    >>> block = Buckets(2, dim=4, bins=4)
    >>> out = block(torch.randn(64, 2))
    >>> out.shape, block.flops(), tuple(block.edges.shape), bool(block.ready)
    (torch.Size([64, 2, 4]), 0, (2, 3), True)
    """

    in_kind = FLAT
    out_kind = FIELD
    num_inputs = 1
    mixes_fields = False
    input_gradients = False

    def __init__(self, in_features: int, *, dim: int, bins: int = BUCKETS, request_in: int | None = None) -> None:
        super().__init__()
        check_positive("in_features", in_features)
        check_positive("dim", dim)
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
            raise ValueError(f"bins must be an int >= 2, got {bins!r}")
        check_request(request_in, in_features)
        self.n, self.bins, self.dim = in_features, bins, dim
        self.table = nn.Embedding(in_features * bins, dim)
        nn.init.normal_(self.table.weight, std=0.05)
        self.register_buffer("edges", torch.zeros(in_features, bins - 1))
        self.register_buffer("ready", torch.zeros((), dtype=torch.bool))
        self.register_buffer("offsets", torch.arange(in_features) * bins, persistent=False)
        self.out_shape = (in_features, dim)
        self.request_out = request_in or 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not bool(self.ready):
            with torch.no_grad():
                self.edges.copy_(bucket_edges(x, self.bins))
                self.ready.fill_(True)
        ids = torch.searchsorted(self.edges, x.detach().float().T.contiguous(), right=True).T  # (B, n) in [0, bins)
        return self.table(ids + self.offsets)  # (B, n, D)

    def flops(self) -> int:
        return 0

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        if not isinstance(widest, Buckets) or not isinstance(in_pos, torch.Tensor):
            raise ValueError(f"buckets: slices from a buckets block by a position tensor, got {type(widest).__name__}")
        rows = (in_pos[:, None] * widest.bins + torch.arange(self.bins)).reshape(-1)  # (n * bins,)
        whole = torch.equal(in_pos, torch.arange(widest.n))
        # Where the cut keeps every feature (the engineer space's buckets read all dense features) the
        # table and the buffers are the widest block's own tensors: the table then trains with the
        # embedding tables' optimizer, as in a candidate, and the first training forward of any path
        # sets the shared edges.
        if whole:
            return {"table.weight": widest.table.weight, "edges": widest.edges, "ready": widest.ready}, in_pos.clone()
        params = {"table.weight": take(widest.table.weight, rows), "edges": widest.edges.index_select(0, in_pos),
                  "ready": widest.ready}
        return params, in_pos.clone()


def unset_buckets(module: nn.Module) -> list[Buckets]:
    """The :class:`Buckets` blocks of ``module`` whose edges are not set yet."""
    return [m for m in module.modules() if isinstance(m, Buckets) and not bool(m.ready)]
