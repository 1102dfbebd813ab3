"""Standalone twin of ``dhen`` (:mod:`rankitect.blocks.dhen`): one DHEN ensemble layer."""

import torch
from torch import nn

from rankitect.export.standalone.field_blocks import FM, Attention, Dot
from rankitect.export.standalone.flat_blocks import DCN
from rankitect.export.standalone.layers import FieldLinear, MaskedLinear, residual_share


class Branch(nn.Module):
    """One interaction module of the ensemble, brought to ``(B, out_fields, D)``."""

    def __init__(
        self, body: nn.Module | None, head: nn.Module | None, *, flatten: bool, out_fields: int, dim: int
    ) -> None:
        super().__init__()
        self.body, self.head, self.flatten = body, head, flatten
        self.out_fields, self.dim = out_fields, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        h = x.reshape(B, -1) if self.flatten else x  # (B, N, D) -> (B, N*D)
        if self.body is not None:
            h = self.body(h)
        if self.head is not None:
            h = self.head(h)
        return h.reshape(B, self.out_fields, self.dim)  # (B, out_fields*D) or (B, out_fields, D)


def make_branch(
    name: str, in_fields: int, dim: int, out_fields: int, request_in: int | None, rocs_share: float | None = None
) -> Branch:
    """Module ``name``; masked, its first ``residual_share`` output fields are request side."""
    masked = request_in is not None
    r = request_in or 0
    out_r = residual_share(request_in, in_fields, out_fields, rocs_share)
    if name == "attention":
        heads = 2 if dim % 2 == 0 else 1
        head = None
        if in_fields != out_fields:
            head = FieldLinear(in_fields, out_fields, request_in=request_in, request_out=out_r)
        body = Attention(in_fields, dim, num_heads=heads, ffn=False, request_in=request_in)
        return Branch(body, head, flatten=False, out_fields=out_fields, dim=dim)
    flat_in = in_fields * dim
    # The flat width the head sees (the body's output, or the flattened input) and its request units.
    if name == "dot":
        body = Dot(in_fields, dim, request_in=request_in)
        width, body_r = in_fields * (in_fields - 1) // 2, r * (r - 1) // 2
    elif name == "fm":
        body = FM(in_fields, dim, request_in=request_in)
        split = masked and r >= 2
        width, body_r = (2 * dim, dim) if split else (dim, 0)
    elif name == "dcn":
        body = DCN(flat_in, num_layers=1, low_rank=dim, request_in=r * dim if masked else None, rocs_share=rocs_share)
        width, body_r = flat_in, r * dim
    else:  # "linear"
        body = None
        width, body_r = flat_in, r * dim
    head = MaskedLinear(width, out_fields * dim, request_in=body_r if masked else None, request_out=out_r * dim)
    return Branch(body, head, flatten=name in ("dcn", "linear"), out_fields=out_fields, dim=dim)


class DHEN(nn.Module):
    """``dhen``: ``LN(combine_m(M_m(X)) + shortcut(X))``: ``(B, N, D) -> (B, out_fields, D)``."""

    def __init__(
        self,
        in_fields: int,
        dim: int,
        *,
        modules: tuple[str, ...] = ("dot", "attention", "linear"),
        out_fields: int = 8,
        combine: str = "concat",
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        self.request_out = t = residual_share(request_in, in_fields, out_fields, rocs_share)
        self.branches = nn.ModuleList(
            make_branch(n, in_fields, dim, out_fields, request_in, rocs_share) for n in modules
        )
        m_r = len(modules) * t if request_in is not None else None
        self.mix = (
            FieldLinear(len(modules) * out_fields, out_fields, request_in=m_r, request_out=t)
            if combine == "concat"
            else None
        )
        self.shortcut = (
            FieldLinear(in_fields, out_fields, bias=False, request_in=request_in, request_out=t)
            if in_fields != out_fields
            else None
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]  # M x (B, out_fields, D)
        if self.mix is not None:
            t = self.request_out
            # Request fields of every module first: (B, M*out_fields, D) -> (B, out_fields, D).
            y = self.mix(torch.cat([o[:, :t] for o in outs] + [o[:, t:] for o in outs], dim=1))
        else:
            y = torch.stack(outs).sum(dim=0)
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return self.norm(y + shortcut)
