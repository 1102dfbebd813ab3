"""A planned supernet path: its steps (one per gene) and the mixed op that runs a step.

:class:`~rankitect.supernet.model.Supernet` plans a path once into :class:`GeneStep` s (template
modules of the path's actual sizes and where their weights sit in the shared widest blocks) and a
:class:`PathPlan`; a :class:`MixedOp` holds one choice site's shared blocks and runs a step with
weights cut from them, scaled by the DNAS gates of the labels that decide it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from rankitect.blocks.base import Block
from rankitect.space.architecture import Architecture, InputRef
from rankitect.space.builder import Head, InputAdapter
from rankitect.supernet.layout import Role
from rankitect.supernet.widest import SharedBlock
from rankitect.supernet.cut import InPos, Params, Take, linear, pick, slice_block


class MixedOp(nn.Module):
    """One choice site: a shared block per option; a path runs one, scaled by its labels' gates."""

    def __init__(self, options: Mapping[str, SharedBlock]) -> None:
        super().__init__()
        self.options = nn.ModuleDict(options)

    def forward(self, step: GeneStep, xs: list[torch.Tensor], gates: Mapping[str, torch.Tensor] | None,
                take: Take = pick) -> torch.Tensor:
        adapter_params, block_params = step.params(self.options[step.option], take)
        xs = functional_call(step.adapter, adapter_params, (xs,))
        return scale(functional_call(step.block, block_params, tuple(xs)), step.role.gates, gates)


@dataclass
class GeneStep:
    """One gene of a planned path: its templates (actual sizes) and where its weights sit."""

    site: str
    option: str
    role: Role
    inputs: tuple[InputRef, ...]
    adapter: InputAdapter
    block: Block
    tokens: int
    in_pos: InPos
    proj_cols: torch.Tensor | None

    def params(self, shared: SharedBlock, take: Take = pick) -> tuple[Params, Params]:
        """The adapter's and the block's weights cut from ``shared`` by ``take`` (default: differentiable)."""
        return self.adapter_params(shared, take), slice_block(
            self.block.op_name, shared.block, self.block, self.in_pos, take)[0]

    def adapter_params(self, shared: SharedBlock, take: Take = pick) -> Params:
        """The projection of a field op's flat inputs to tokens: first ``tokens * D`` rows, their columns."""
        if self.proj_cols is None or shared.proj is None:
            return {}
        return linear("proj.", shared.proj, self.tokens * shared.dim, self.proj_cols, take)


@dataclass
class PathPlan:
    """A path turned into steps: the architecture, its genes' steps and its head."""

    arch: Architecture
    steps: list[GeneStep]
    head: Head
    head_pos: torch.Tensor
    head_gates: tuple[str, ...]


def scale(x: torch.Tensor, labels: tuple[str, ...], gates: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
    """``x`` times the gates of ``labels`` (unchanged without gates)."""
    if gates is None:
        return x
    for label in labels:
        x = x * gates[label]
    return x


__all__ = ["GeneStep", "MixedOp", "PathPlan", "scale"]
