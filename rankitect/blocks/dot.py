"""``dot``: DLRM pairwise dot products between fields."""

from __future__ import annotations

import torch

from rankitect.blocks.base import FIELD, FLAT, Block, register_block
from rankitect.blocks.common import check_positive, check_request
from rankitect.blocks.slicing import InPos, Params, Take, pair_positions, pick
from rankitect.blocks.split import Split


def pair_order(in_fields: int, request_in: int | None) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, row-major; request x request pairs first when masked.

    >>> pair_order(4, None)
    [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    >>> pair_order(4, 2)
    [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    >>> pair_order(4, 3)[:3]
    [(0, 1), (0, 2), (1, 2)]
    """
    pairs = [(i, j) for i in range(in_fields) for j in range(i + 1, in_fields)]
    if not request_in:
        return pairs
    # A stable sort keeps row-major order inside each group.
    return sorted(pairs, key=lambda p: p[1] >= request_in)


@register_block("dot")
class Dot(Block):
    """All pairwise inner products of the field embeddings (DLRM interaction).

    Paper: DLRM, Naumov et al. 2019, arXiv 1906.00091.

    Update rule: :math:`y_{(i,j)} = \\langle e_i, e_j \\rangle` for every pair ``i < j``.

    Computed as one batched Gram matrix ``X Xᵀ`` (``2 N² D`` FLOPs per example) from which the
    upper triangle is gathered. ROCS masking: the pairs are ordered so that the ``R(R-1)/2``
    request x request pairs come first; those depend only on request fields (none when ``R < 2``).

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        request_in: request-side input fields (``None`` = unmasked).

    Shapes: ``(B, N, D) -> (B, N(N-1)/2)``.

    >>> block = Dot(4, 8, request_in=3)
    >>> block(torch.randn(2, 4, 8)).shape, block.request_out, block.flops()
    (torch.Size([2, 6]), 3, 256)
    """

    in_kind = FIELD
    out_kind = FLAT
    num_inputs = 1

    def __init__(self, in_fields: int, dim: int, *, request_in: int | None = None) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_request(request_in, in_fields)
        if in_fields < 2:
            raise ValueError(f"dot needs in_fields >= 2 to form a pair, got {in_fields!r}")
        pairs = pair_order(in_fields, request_in)
        # Flat positions of (i, j) in the row-major (N, N) Gram matrix.
        index = torch.tensor([i * in_fields + j for i, j in pairs], dtype=torch.long)
        self.register_buffer("index", index, persistent=False)
        self.in_fields, self.dim = in_fields, dim
        r = request_in or 0
        self.request_out = r * (r - 1) // 2
        self.out_shape = (len(pairs),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        gram = torch.bmm(x, x.transpose(1, 2))  # (B, N, D) @ (B, D, N) -> (B, N, N)
        return gram.reshape(B, N * N).index_select(1, self.index)  # (B, N*N) -> (B, P)

    def flops(self) -> int:
        return 2 * self.in_fields * self.in_fields * self.dim

    def forward_split(self, x: Split) -> Split:
        """Request x request pairs once per request; candidate rows of the Gram matrix per candidate."""
        R, N = x.request_width, self.in_fields
        C, u, c = N - R, x.req, x.cand
        gram_u = torch.bmm(u, u.transpose(1, 2))  # (Q, R, D) @ (Q, D, R) -> (Q, R, R)
        # Candidate rows of the Gram matrix: against the request fields and against each other.
        cross = torch.bmm(c, u.index_select(0, x.index).transpose(1, 2))  # (B, C, D) @ (B, D, R) -> (B, C, R)
        own = torch.bmm(c, c.transpose(1, 2))  # (B, C, D) @ (B, D, C) -> (B, C, C)
        # The block's pairs (i, j), i < j, in its output order (request x request pairs first).
        i, j = self.index // N, self.index % N
        n_req = R * (R - 1) // 2
        req = gram_u.reshape(u.shape[0], R * R).index_select(1, i[:n_req] * R + j[:n_req])  # (Q, R(R-1)/2)
        i, j = i[n_req:], j[n_req:]  # j >= R: pairs with a candidate field
        pos = torch.where(i < R, (j - R) * R + i, C * R + (i - R) * C + (j - R))  # in [cross | own]
        both = torch.cat([cross.reshape(c.shape[0], C * R), own.reshape(c.shape[0], C * C)], dim=1)  # (B, CR + CC)
        return x.like(req, both.index_select(1, pos))

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        return {}, pair_positions(in_pos, widest.in_fields)
