"""Cutting a block's weights out of the same block built at its widest (NASRec-style weight sharing).

Each block carries its own rule (:meth:`~rankitect.blocks.base.Block.slice_from`, and
:meth:`~rankitect.blocks.base.Block.widest` for the widest layout); the helpers it is written
with live in :mod:`rankitect.blocks.slicing`. This module asks the block.

>>> import torch
>>> from rankitect.blocks import build_block
>>> widest = build_block("mlp", (6,), {"width": 8})
>>> narrow = build_block("mlp", (2,), {"width": 3})
>>> params, out_pos = slice_block("mlp", widest, narrow, torch.tensor([4, 1]))
>>> torch.equal(params["layers.0.weight"], widest.layers[0].weight[:3][:, [4, 1]]), out_pos.tolist()
(True, [0, 1, 2])
"""

from __future__ import annotations

import torch

from rankitect.blocks.base import Block, get_block_class
from rankitect.blocks.slicing import Index, InPos, Params, Take, flat_positions, pair_positions, pick
from rankitect.blocks.slicing import slice_linear as linear


def slice_block(
    op: str, widest: Block, block: Block, in_pos: InPos, take: Take = pick
) -> tuple[Params, torch.Tensor]:
    """The parameters of ``block`` cut from ``widest`` (both op ``op``) by ``take``, and its output positions."""
    get_block_class(op)
    return block.slice_from(widest, in_pos, take)


def widest_params(op: str, in_shape: tuple[int, ...], params: dict) -> tuple[tuple[int, ...], dict]:
    """The widest block's input shape and params, adjusted so that every optional part exists."""
    return get_block_class(op).widest(in_shape, params)


# The helpers the supernet modules take from here, beside this module's own two functions.
__all__ = ["InPos", "Index", "Params", "Take", "flat_positions", "linear", "pair_positions", "pick", "slice_block",
           "widest_params"]
