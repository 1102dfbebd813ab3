"""``target_attention``: DIN's activation unit, the candidate item as the query over the history."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankitect.blocks.base import FIELD, SEQUENCE, Block, register_block
from rankitect.blocks.common import check_positive, make_activation
from rankitect.blocks.sequence import History, HistorySplit, check_sequence_request
from rankitect.blocks.slicing import InPos, Params, Take, pick, slice_linear
from rankitect.blocks.split import Split


@register_block("target_attention")
class TargetAttention(Block):
    """DIN target attention: a small MLP weighs each history item by its relation to the candidate.

    Paper: Deep Interest Network, Zhou et al., KDD'18, arXiv 1706.06978 (the activation unit).

    Update rule: :math:`w_i = \\mathrm{MLP}([e_i, v, e_i - v, e_i \\odot v])`,
    :math:`u = \\sum_i m_i w_i e_i`, with no softmax (the sum keeps the intensity of interest); the
    MLP has ``num_layers`` hidden layers of ``width``, ``width / 2``, ... units (80-40 in the paper)
    and a linear output.

    The candidate ``v`` enters every weight, so the output is candidate side. On ROCS splits the
    first layer's history part, :math:`(W_e + W_d) e_i`, runs once per request (split as
    :math:`W[e, v, e - v, e \\odot v] = (W_e + W_d) e + (W_v - W_d) v + W_p (e \\odot v)`).

    Args:
        max_len: history length L.
        dim: embedding dimension D.
        width: units of the first hidden layer (each next layer has half, at least 1).
        num_layers: hidden layers.
        activation: ``"relu"``, ``"gelu"``, ``"silu"`` or ``"none"``.
        request_in: ``None`` (unmasked), or ``max_len`` for a request-side history.

    Shapes: ``History(seq (B, L, D), mask (B, L), target (B, D)) -> (B, 1, D)``.

    >>> din = TargetAttention(5, 4, width=8, num_layers=2)
    >>> x = History(torch.randn(3, 5, 4), torch.rand(3, 5) > 0.5, torch.randn(3, 4))
    >>> din(x).shape, din.flops()  # 2 L (4 D x 8 + 8 x 4 + 4 x 1)
    (torch.Size([3, 1, 4]), 1640)
    """

    in_kind = SEQUENCE
    out_kind = FIELD
    num_inputs = 1
    mixes_fields = False
    uses_target = True

    def __init__(
        self, max_len: int, dim: int, *, width: int = 80, num_layers: int = 2, activation: str = "relu",
        request_in: int | None = None,
    ) -> None:
        super().__init__()
        check_positive("max_len", max_len)
        check_positive("dim", dim)
        check_positive("width", width)
        check_positive("num_layers", num_layers)
        check_sequence_request(request_in, max_len)
        self.max_len, self.dim = max_len, dim
        widths = [max(1, width >> k) for k in range(num_layers)]
        sizes = [4 * dim, *widths]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.activation = make_activation(activation)
        self.out = nn.Linear(sizes[-1], 1)
        self.out_shape = (1, dim)
        self.request_out = 0

    def weights(self, h: torch.Tensor) -> torch.Tensor:
        """The item weights ``(B, L)`` from the first layer's pre-activation ``h`` ``(B, L, width)``."""
        h = self.activation(h)
        for layer in self.hidden[1:]:
            h = self.activation(layer(h))  # (B, L, w_k) -> (B, L, w_k+1)
        return self.out(h).squeeze(-1)  # (B, L, w) -> (B, L)

    def forward(self, x: History) -> torch.Tensor:
        e, v = x.seq, x.target.unsqueeze(1).expand_as(x.seq)  # (B, L, D) each
        w = self.weights(self.hidden[0](torch.cat([e, v, e - v, e * v], dim=-1)))  # (B, L, 4D) -> (B, L)
        return self.pool(w, e, x.mask)

    @staticmethod
    def pool(w: torch.Tensor, e: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``sum_i m_i w_i e_i``: ``(B, L), (B, L, D), (B, L) -> (B, 1, D)``."""
        return (e * (w * mask.to(w.dtype)).unsqueeze(-1)).sum(dim=1, keepdim=True)

    def forward_split(self, x: HistorySplit) -> Split:
        """The first layer's history part once per request, the rest per candidate."""
        D = self.dim
        first = self.hidden[0]
        w_e, w_v, w_m, w_p = first.weight.split(D, dim=1)  # 4 x (width, D): [e, v, e - v, e * v]
        per_request = F.linear(x.seq, w_e + w_m)  # (Q, L, D) @ (D, width) -> (Q, L, width)
        per_candidate = F.linear(x.target, w_v - w_m, first.bias)  # (B, D) -> (B, width)
        e = x.seq.index_select(0, x.index)  # (B, L, D)
        product = F.linear(e * x.target.unsqueeze(1), w_p)  # (B, L, D) @ (D, width) -> (B, L, width)
        h = per_request.index_select(0, x.index) + per_candidate.unsqueeze(1) + product
        return x.candidate_fields(self.pool(self.weights(h), e, x.mask.index_select(0, x.index)))

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        """The first units of each hidden layer (the same number of layers; the input is always 4D)."""
        if len(self.hidden) != len(widest.hidden):
            raise ValueError(f"target_attention: {len(self.hidden)} layers cannot be cut from {len(widest.hidden)}")
        params: Params = {}
        cols = None
        for k, layer in enumerate(self.hidden):
            params.update(slice_linear(f"hidden.{k}.", widest.hidden[k], layer.out_features, cols, take))
            cols = layer.out_features
        params.update(slice_linear("out.", widest.out, None, cols, take))
        return params, torch.arange(1)

    def flops(self) -> int:
        layers = [*self.hidden, self.out]
        return sum(2 * self.max_len * m.in_features * m.out_features for m in layers)
