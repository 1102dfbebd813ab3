"""Cutting a block's weights out of the same block built at its widest (NASRec-style weight sharing).

A supernet holds every op at its widest; a narrower choice uses the *first* units of each layer
(masking the rest is what NASRec does; slicing computes the same thing without the dead units).
Inputs are not always a prefix: a block reads a subset of the ports its widest layout can hold, so
its input units are given as *positions* (a ``LongTensor``) into the widest input. Each block's
:meth:`~rankitect.blocks.base.Block.slice_from` returns its parameters (named as in
``block.named_parameters()``) as slices of the widest block's tensors, differentiable into them,
and the positions of its outputs in the widest output (fields for a field output, units for a
flat one); the helpers here are what those rules are written with. Imports only torch.

Shapes: ``in_pos`` is ``(N,)`` field positions for a field block, ``(W,)`` unit positions for a flat
block, or a ``(left, right)`` pair for a two-input block.

>>> lin = nn.Linear(4, 3)
>>> cut = slice_linear("proj.", lin, 2, torch.tensor([3, 0]))
>>> torch.equal(cut["proj.weight"], lin.weight[:2][:, [3, 0]]), tuple(cut["proj.bias"].shape)
(True, (2,))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from torch import nn

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


def slice_linear(prefix: str, widest: nn.Linear, rows: Index, cols: Index, take: Take = pick) -> Params:
    """Weight ``(out, in)`` cut to ``rows x cols`` and bias to ``rows`` (when there is one)."""
    out = {f"{prefix}weight": take(widest.weight, rows, cols)}
    if widest.bias is not None:
        out[f"{prefix}bias"] = take(widest.bias, rows)
    return out


def slice_affine(prefix: str, widest: nn.Module, units: Index, take: Take = pick, *,
                 like: nn.Module | None = None) -> Params:
    """A norm's ``weight``/``bias`` cut to ``units`` (nothing for an identity "norm"); with ``like``,
    the parameters that module has (another kind of norm, or none) cut from ``widest``'s."""
    names = [n for n, _ in (like if like is not None else widest).named_parameters(recurse=False)]
    return {f"{prefix}{n}": take(getattr(widest, n), units) for n in names}


def slice_whole(prefix: str, widest: nn.Module, take: Take = pick) -> Params:
    """Every parameter of ``widest`` uncut (parts that do not depend on a size choice)."""
    return {f"{prefix}{n}": take(p) for n, p in widest.named_parameters()}


def prefixed(prefix: str, params: Params) -> Params:
    """``params`` of a submodule named from its parent (``prefix`` ends with a dot)."""
    return {f"{prefix}{n}": p for n, p in params.items()}


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


__all__ = [
    "InPos",
    "Index",
    "Params",
    "Take",
    "flat_positions",
    "pair_positions",
    "pick",
    "prefixed",
    "slice_affine",
    "slice_linear",
    "slice_whole",
]
