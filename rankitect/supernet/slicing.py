"""Cutting a block's weights out of the same block built at its widest (NASRec-style weight sharing).

A supernet holds every op at its widest; a narrower choice uses the *first* units of each layer
(masking the rest is what NASRec does; slicing computes the same thing without the dead units).
Inputs are not always a prefix: a block reads a subset of the ports its widest layout can hold, so
its input units are given as *positions* (a ``LongTensor``) into the widest input. Every function
here returns the narrow block's parameters (named as in ``block.named_parameters()``) as slices of
the widest block's tensors, differentiable into them, and the positions of the narrow block's
outputs in the widest output (fields for a field output, units for a flat one).

Shapes: ``in_pos`` is ``(N,)`` field positions for a field block, ``(W,)`` unit positions for a flat
block, or a ``(left, right)`` pair for a two-input block.

>>> import torch
>>> from rankitect.blocks import build_block
>>> widest = build_block("mlp", (6,), {"width": 8})
>>> narrow = build_block("mlp", (2,), {"width": 3})
>>> params, out_pos = slice_block("mlp", widest, narrow, torch.tensor([4, 1]))
>>> torch.equal(params["layers.0.weight"], widest.layers[0].weight[:3][:, [4, 1]]), out_pos.tolist()
(True, [0, 1, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from torch import nn

from rankitect.blocks.base import Block
from rankitect.blocks.common import MaskedLinear
from rankitect.blocks.dhen import MODULES

Index = Union[int, torch.Tensor, None]  # first n units, explicit positions, or all
Params = dict[str, torch.Tensor]
InPos = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]
Take = Callable[..., torch.Tensor]  # take(t, *index): the cut of t (``pick``, or a trainer's leaf copy)


def pick(t: torch.Tensor, *index: Index) -> torch.Tensor:
    """``t`` cut along its leading axes: an int keeps the first units, a tensor gathers, None keeps all."""
    for dim, idx in enumerate(index):
        if isinstance(idx, int):
            t = t.narrow(dim, 0, idx)
        elif idx is not None:
            t = t.index_select(dim, idx)
    return t


def linear(prefix: str, widest: nn.Linear, rows: Index, cols: Index, take: Take = pick) -> Params:
    """Weight ``(out, in)`` cut to ``rows x cols`` and bias to ``rows`` (when there is one)."""
    out = {f"{prefix}weight": take(widest.weight, rows, cols)}
    if widest.bias is not None:
        out[f"{prefix}bias"] = take(widest.bias, rows)
    return out


def affine(prefix: str, widest: nn.Module, units: Index, take: Take = pick) -> Params:
    """A norm's ``weight``/``bias`` cut to ``units`` (nothing for an identity "norm")."""
    names = [n for n, _ in widest.named_parameters(recurse=False)]
    return {f"{prefix}{n}": take(getattr(widest, n), units) for n in names}


def whole(prefix: str, widest: nn.Module, take: Take = pick) -> Params:
    """Every parameter of ``widest`` uncut (parts that do not depend on a size choice)."""
    return {f"{prefix}{n}": take(p) for n, p in widest.named_parameters()}


def pair_positions(in_pos: torch.Tensor, widest_fields: int) -> torch.Tensor:
    """Positions of the narrow block's field pairs among the widest block's pairs.

    Pairs are row-major ``(i, j)``, ``i < j`` over the narrow fields (:func:`dot.pair_order`); a pair of
    widest positions ``(a, b)`` (sorted, so the input order never matters) sits at row-major index
    ``a N - a (a + 1) / 2 + b - a - 1`` among the widest block's ``N (N - 1) / 2`` pairs.

    >>> pair_positions(torch.tensor([0, 2, 3]), 4).tolist()  # pairs (0,2) (0,3) (2,3) of 4 fields
    [1, 2, 5]
    """
    i, j = torch.triu_indices(len(in_pos), len(in_pos), offset=1)
    a = torch.minimum(in_pos[i], in_pos[j])
    b = torch.maximum(in_pos[i], in_pos[j])
    return a * widest_fields - a * (a + 1) // 2 + b - a - 1


def flat_positions(field_pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Unit positions of flattened fields: ``(N,)`` field positions -> ``(N * D,)`` units ``p * D + d``."""
    return (field_pos[:, None] * dim + torch.arange(dim)).reshape(-1)  # (N, 1) + (D,) -> (N*D,)


def _mlp_layers(prefix: str, widest: nn.Sequential, block: nn.Sequential, in_pos: Index, take: Take) -> Params:
    """A stack of ``Linear -> norm -> act`` triples: the first layers of the widest, first units."""
    out: Params = {}
    cols = in_pos
    for i in range(0, len(block), 3):
        width = block[i].out_features
        out.update(linear(f"{prefix}{i}.", widest[i], width, cols, take))
        out.update(affine(f"{prefix}{i + 1}.", widest[i + 1], width, take))
        cols = width
    return out


def _mlp(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    return _mlp_layers("layers.", widest.layers, block.layers, in_pos, take), torch.arange(block.out_shape[0])


def _efc(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    fields = block.out_shape[0]
    return linear("linear.", widest.linear, fields, in_pos, take), torch.arange(fields)


def _dot(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    return {}, pair_positions(in_pos, widest.in_fields)


def _fm(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    return {}, torch.arange(block.out_shape[0])


def _gating(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    left, right = in_pos
    width = block.out_shape[0]
    params = {**linear("gate.", widest.gate, right, left, take), **linear("proj.", widest.proj, width, right, take)}
    return params, torch.arange(width)


def _sum(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    left, right = in_pos
    width = block.out_shape[0]
    params = {**linear("left.", widest.left, width, left, take), **linear("right.", widest.right, width, right, take)}
    return params, torch.arange(width)


def _attention(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    # Every weight acts on the embedding dimension only; the field count and heads change no shape.
    params = {**whole("qkv.", widest.qkv, take), **whole("proj.", widest.proj, take),
              **whole("norm.", widest.norm, take)}
    if block.ffn is not None:
        params.update({**whole("ffn.", widest.ffn, take), **whole("ffn_norm.", widest.ffn_norm, take)})
    return params, in_pos


def _dcn(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    params: Params = {}
    for i, layer in enumerate(block.layers):
        w = widest.layers[i]
        if isinstance(layer.down, MaskedLinear):  # low rank: W = U V^T with the first `rank` units
            rank = layer.down.out_features
            params.update(linear(f"layers.{i}.down.", w.down, rank, in_pos, take))
            params.update(linear(f"layers.{i}.up.", w.up, in_pos, rank, take))
        else:
            params.update(linear(f"layers.{i}.up.", w.up, in_pos, in_pos, take))
    return params, in_pos


def _wukong(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    fmb, wide = block.fmb, widest.fmb
    k, dim = fmb.low_rank, block.dim
    # Z = X (X^T Y) is (N, k) flattened row-major: widest unit of (field p, rank c) is p * K + c.
    z_pos = (in_pos[:, None] * wide.low_rank + torch.arange(k)).reshape(-1)  # (N, 1) + (k,) -> (N*k,)
    if fmb.mlp is None and wide.mlp is not None:
        raise ValueError("supernet: a wukong layer without FMB MLP layers cannot share the widest one's weights")
    params: Params = {"fmb.y": take(wide.y, in_pos, k), **affine("fmb.norm.", wide.norm, z_pos, take)}
    hidden: Index = z_pos
    if fmb.mlp is not None:
        params.update(_mlp_layers("fmb.mlp.layers.", wide.mlp.layers, fmb.mlp.layers, z_pos, take))
        hidden = fmb.mlp.out_shape[0]
    params.update(linear("fmb.out.", wide.out, fmb.out_fields * dim, hidden, take))
    f, c = block.fmb.out_fields, block.lcb.out_features
    out_pos = torch.cat([torch.arange(f), wide.out_fields + torch.arange(c)])  # FMB fields, then LCB
    params.update(linear("lcb.", widest.lcb, c, in_pos, take))
    if block.residual is not None:
        params.update(linear("residual.", widest.residual, out_pos, in_pos, take))
    params.update(whole("norm.", widest.norm, take))
    return params, out_pos


def _dhen_branch(prefix: str, name: str, widest: nn.Module, branch: nn.Module, in_pos: torch.Tensor,
                 widest_fields: int, take: Take) -> Params:
    """One ensemble module: its body's weights and its head onto the first ``out_fields`` fields."""
    dim, rows = branch.dim, branch.out_fields * branch.dim
    if name == "attention":
        params = _attention(widest.body, branch.body, in_pos, take)[0]
        params = {f"{prefix}body.{n}": p for n, p in params.items()}
        if branch.head is not None:
            params.update(linear(f"{prefix}head.", widest.head, branch.out_fields, in_pos, take))
        return params
    units = flat_positions(in_pos, dim)
    cols = {"dot": pair_positions(in_pos, widest_fields), "fm": None, "linear": units, "dcn": units}[name]
    params = linear(f"{prefix}head.", widest.head, rows, cols, take)
    if name == "dcn":
        body = _dcn(widest.body, branch.body, units, take)[0]
        params.update({f"{prefix}body.{n}": p for n, p in body.items()})
    return params


def _dhen(widest: Block, block: Block, in_pos: InPos, take: Take) -> tuple[Params, torch.Tensor]:
    out_fields, wide_out = block.out_shape[0], widest.out_shape[0]
    widest_fields = widest.branches[MODULES.index("dot")].body.in_fields
    params: Params = {}
    mix_cols = []
    for i, name in enumerate(block.module_names):
        j = widest.module_names.index(name)
        params.update(_dhen_branch(f"branches.{i}.", name, widest.branches[j], block.branches[i], in_pos,
                                   widest_fields, take))
        mix_cols.append(j * wide_out + torch.arange(out_fields))  # module j's fields in the widest concat
    if block.mix is not None:
        params.update(linear("mix.", widest.mix, out_fields, torch.cat(mix_cols), take))
    if block.shortcut is not None:
        params.update(linear("shortcut.", widest.shortcut, out_fields, in_pos, take))
    params.update(whole("norm.", widest.norm, take))
    return params, torch.arange(out_fields)


SLICERS: dict[str, Callable[[Block, Block, InPos, Take], tuple[Params, torch.Tensor]]] = {
    "mlp": _mlp, "efc": _efc, "dot": _dot, "fm": _fm, "gating": _gating, "sum": _sum,
    "attention": _attention, "dcn": _dcn, "wukong": _wukong, "dhen": _dhen,
}


def slice_block(
    op: str, widest: Block, block: Block, in_pos: InPos, take: Take = pick
) -> tuple[Params, torch.Tensor]:
    """The parameters of ``block`` cut from ``widest`` (both op ``op``) by ``take``, and its output positions."""
    if op not in SLICERS:
        raise ValueError(f"supernet: block op {op!r} has no weight-sharing rule; known: {sorted(SLICERS)}")
    return SLICERS[op](widest, block, in_pos, take)


def widest_params(op: str, in_shape: tuple[int, ...], params: dict) -> tuple[tuple[int, ...], dict]:
    """The widest block's input shape and params, adjusted so that every optional part exists.

    A Wukong residual, a DHEN shortcut and a DHEN attention head exist only when the input field
    count differs from the output's; a widest block whose counts happen to agree gets one spare
    input field (never filled) so that narrower blocks, whose counts differ, find those weights.
    A DHEN at its widest holds every module.
    """
    params = dict(params)
    if op == "dhen":
        params["modules"] = MODULES
    out_fields = {"wukong": lambda: params["fmb_fields"] + params["lcb_fields"],
                  "dhen": lambda: params["out_fields"]}.get(op)
    if out_fields is not None and in_shape[0] == out_fields():
        in_shape = (in_shape[0] + 1, *in_shape[1:])
    return in_shape, params


__all__ = ["SLICERS", "flat_positions", "pair_positions", "pick", "slice_block", "widest_params"]
