"""``dhen``: one DHEN layer, an ensemble of heterogeneous interaction modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rankitect.blocks.attention import Attention
from rankitect.blocks.base import FIELD, Block, register_block
from rankitect.blocks.common import (
    FieldLinear,
    MaskedLinear,
    check_positive,
    check_request,
    residual_share,
)
from rankitect.blocks.dcn import DCN
from rankitect.blocks.dot import Dot
from rankitect.blocks.fm import FM
from rankitect.blocks.slicing import InPos, Params, Take, flat_positions, pick, prefixed, slice_linear, slice_whole
from rankitect.blocks.split import Split, add, cat, field_linear, linear

MODULES = ("dot", "attention", "linear", "dcn", "fm")
COMBINES = ("concat", "sum")


class Branch(nn.Module):
    """One interaction module of the ensemble, brought to ``(B, out_fields, D)``.

    ``body`` (a block, or nothing) runs on the fields, or on the flattened ``(B, N*D)`` input when
    ``flatten`` is set; ``head`` (a masked linear map on a flat result, a field map on a field
    result, or nothing) brings the result to ``out_fields`` fields.
    """

    def __init__(
        self, body: Block | None, head: MaskedLinear | None, *, flatten: bool, out_fields: int, dim: int
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

    def flops(self) -> int:
        body = self.body.flops() if self.body is not None else 0
        if isinstance(self.head, FieldLinear):
            return body + self.head.field_flops(self.dim)
        return body + (self.head.flops() if self.head is not None else 0)

    def forward_split(self, x: Split) -> Split:
        h = x.flat() if self.flatten else x
        if self.body is not None:
            h = self.body.forward_split(h)
        if isinstance(self.head, FieldLinear):
            h = field_linear(self.head, h)
        elif self.head is not None:
            h = linear(self.head, h)
        return h if h.req.dim() == 3 else h.fields(self.dim)

    def slice_from(self, prefix: str, widest: Branch, in_pos: torch.Tensor, take: Take) -> Params:
        """The body's cut on the (flattened) input positions, then the head onto the first fields."""
        pos = flat_positions(in_pos, self.dim) if self.flatten else in_pos
        params: Params = {}
        if self.body is not None:
            body, pos = self.body.slice_from(widest.body, pos, take)  # pos: the body's outputs in the widest's
            params.update(prefixed(f"{prefix}body.", body))
        if self.head is not None:
            rows = self.out_fields if isinstance(self.head, FieldLinear) else self.out_fields * self.dim
            params.update(slice_linear(f"{prefix}head.", widest.head, rows, pos, take))
        return params


def make_branch(
    name: str, in_fields: int, dim: int, out_fields: int, request_in: int | None, rocs_share: float | None = None
) -> Branch:
    """Build module ``name``; masked, its first ``residual_share`` output fields are request side."""
    masked = request_in is not None
    r = request_in or 0
    out_r = residual_share(request_in, in_fields, out_fields, rocs_share)
    if name == "attention":
        heads = 2 if dim % 2 == 0 else 1
        body: Block | None = Attention(in_fields, dim, num_heads=heads, ffn=False, request_in=request_in)
        head = None
        if in_fields != out_fields:
            head = FieldLinear(in_fields, out_fields, request_in=request_in, request_out=out_r)
        return Branch(body, head, flatten=False, out_fields=out_fields, dim=dim)
    flat_in = in_fields * dim
    body = {
        "dot": lambda: Dot(in_fields, dim, request_in=request_in),
        "fm": lambda: FM(in_fields, dim, request_in=request_in),
        "dcn": lambda: DCN(
            flat_in, num_layers=1, low_rank=dim, request_in=r * dim if masked else None, rocs_share=rocs_share
        ),
        "linear": lambda: None,
    }[name]()
    # The flat width the head sees: the body's output, or the flattened input (N*D,) for "linear".
    width, body_r = (flat_in, r * dim) if body is None else (body.out_shape[0], body.request_out)
    head_r = body_r if masked else None
    head = MaskedLinear(width, out_fields * dim, request_in=head_r, request_out=out_r * dim)
    return Branch(body, head, flatten=name in ("dcn", "linear"), out_fields=out_fields, dim=dim)


@register_block("dhen")
class DHEN(Block):
    """One DHEN layer: heterogeneous interaction modules on one input, combined, shortcut, LayerNorm.

    Paper: DHEN, Zhang et al. 2022, arXiv 2203.11014.

    Update rule: :math:`X_{l+1} = \\mathrm{LN}(\\mathrm{combine}_m(M_m(X_l)) + X_l W_{sc})`.

    Modules, each ending in ``(B, out_fields, D)``: ``dot`` (DLRM pairwise dots, then a linear
    map), ``fm`` (field-wise FM, then a linear map), ``linear`` (one linear map of the flattened
    input), ``dcn`` (one low-rank DCNv2 cross layer of rank D on the flattened input, then a linear
    map), ``attention`` (self-attention without FFN, 2 heads when D is even, then a map along the
    fields if ``N != out_fields``). ``combine="concat"`` stacks the modules' fields and maps them
    back to ``out_fields`` along the field axis; ``"sum"`` adds them. The shortcut is the identity
    when ``N == out_fields``, else a linear map along the fields. ROCS masking: every module and
    map is masked so that its first ``request_out`` fields (share of ``out_fields`` proportional to
    ``R / N``, or ``rocs_share`` of them; ``R`` itself when the shortcut is the identity) depend
    only on request fields; concat puts the request fields of all modules first.

    Args:
        in_fields: number N of input fields.
        dim: embedding dimension D.
        modules: at least two distinct names from ``dot``, ``attention``, ``linear``, ``dcn``, ``fm``.
        out_fields: number of output fields.
        combine: ``"concat"`` or ``"sum"``.
        request_in: request-side input fields (``None`` = unmasked).
        rocs_share: fraction of each masked layer's outputs that are request side (``None``:
            proportional to its input share).

    Shapes: ``(B, N, D) -> (B, out_fields, D)``.

    >>> block = DHEN(4, 8, modules=["dot", "attention", "fm"], out_fields=3)
    >>> block(torch.randn(2, 4, 8)).shape, block.flops()
    (torch.Size([2, 3, 8]), 4304)
    """

    in_kind = FIELD
    out_kind = FIELD
    num_inputs = 1

    def __init__(
        self,
        in_fields: int,
        dim: int,
        *,
        modules: Sequence[str] = ("dot", "attention", "linear"),
        out_fields: int = 8,
        combine: str = "concat",
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        check_positive("in_fields", in_fields)
        check_positive("dim", dim)
        check_positive("out_fields", out_fields)
        check_request(request_in, in_fields)
        names = check_modules(modules)
        if combine not in COMBINES:
            raise ValueError(f"unknown combine {combine!r}; known: {list(COMBINES)}")
        self.module_names, self.combine, self.dim = names, combine, dim
        self.request_out = residual_share(request_in, in_fields, out_fields, rocs_share)
        t = self.request_out
        self.branches = nn.ModuleList(
            make_branch(n, in_fields, dim, out_fields, request_in, rocs_share) for n in names
        )
        m_r = len(names) * t if request_in is not None else None
        self.mix = (
            FieldLinear(len(names) * out_fields, out_fields, request_in=m_r, request_out=t)
            if combine == "concat"
            else None
        )
        self.shortcut = (
            FieldLinear(in_fields, out_fields, bias=False, request_in=request_in, request_out=t)
            if in_fields != out_fields
            else None
        )
        self.norm = nn.LayerNorm(dim)
        self.out_shape = (out_fields, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]  # M x (B, out_fields, D)
        if self.mix is not None:
            t = self.request_out
            # Request fields of every module first: (B, M*out_fields, D) -> (B, out_fields, D).
            y = self.mix(torch.cat([o[:, :t] for o in outs] + [o[:, t:] for o in outs], dim=1))
        else:
            y = torch.stack(outs).sum(dim=0)  # (M, B, out_fields, D) -> (B, out_fields, D)
        shortcut = x if self.shortcut is None else self.shortcut(x)  # (B, out_fields, D)
        return self.norm(y + shortcut)

    def flops(self) -> int:
        total = sum(b.flops() for b in self.branches)
        if self.mix is not None:
            total += self.mix.field_flops(self.dim)
        if self.shortcut is not None:
            total += self.shortcut.field_flops(self.dim)
        return total

    def forward_split(self, x: Split) -> Split:
        outs = [b.forward_split(x) for b in self.branches]  # M x field splits of out_fields
        if self.mix is not None:
            y = field_linear(self.mix, cat(outs))  # request fields of every module first
        else:
            y = outs[0]
            for o in outs[1:]:
                y = add(y, o)
        shortcut = x if self.shortcut is None else field_linear(self.shortcut, x)
        return add(y, shortcut).map(self.norm)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        out_fields, wide_out = self.out_shape[0], widest.out_shape[0]
        params: Params = {}
        mix_cols = []
        for i, name in enumerate(self.module_names):
            j = widest.module_names.index(name)
            params.update(self.branches[i].slice_from(f"branches.{i}.", widest.branches[j], in_pos, take))
            mix_cols.append(j * wide_out + torch.arange(out_fields))  # module j's fields in the widest concat
        if self.mix is not None:
            params.update(slice_linear("mix.", widest.mix, out_fields, torch.cat(mix_cols), take))
        if self.shortcut is not None:
            params.update(slice_linear("shortcut.", widest.shortcut, out_fields, in_pos, take))
        params.update(slice_whole("norm.", widest.norm, take))
        return params, torch.arange(out_fields)

    @classmethod
    def widest(cls, in_shape: tuple[int, ...], params: Mapping[str, Any]) -> tuple[tuple[int, ...], dict]:
        """Every module; a shortcut and an attention head exist only when the input field count
        differs from the output's, so a widest layer whose counts agree gets one spare input field
        (never filled) where narrower layers, whose counts differ, find those weights."""
        params = {**params, "modules": MODULES}
        if in_shape[0] == params["out_fields"]:
            in_shape = (in_shape[0] + 1, *in_shape[1:])
        return in_shape, params


def check_modules(modules: Sequence[str]) -> tuple[str, ...]:
    """Validate the module names of a DHEN layer (a JSON list or any sequence of strings)."""
    if isinstance(modules, (str, bytes)) or not isinstance(modules, Sequence):
        raise ValueError(f"modules must be a sequence of names, got {modules!r}")
    for name in modules:
        if name not in MODULES:
            raise ValueError(f"unknown DHEN module {name!r}; known: {list(MODULES)}")
    names = tuple(modules)
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"modules must be at least two distinct names, got {list(names)}")
    return names
