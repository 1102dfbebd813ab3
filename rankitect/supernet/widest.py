"""The widest blocks of a supernet and where a path's inputs sit in their inputs.

:class:`SharedBlock` is one site at its widest (:mod:`rankitect.supernet.layout`): a field
op's projection of flat inputs to tokens and the block, built through
:func:`~rankitect.blocks.build_block`; :class:`SupernetHead` is the head at its widest. A widest
input is the concatenation of its segments; a port's units start at its segment's offset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rankitect.blocks.base import FIELD, SEQUENCE, build_block, get_block_class
from rankitect.blocks.common import MaskedLinear
from rankitect.supernet.layout import HeadSite, Segments, Site
from rankitect.supernet.cut import InPos, Params, Take, flat_positions, linear, pick, widest_params
from rankitect.train.loop import base_rate_logit

Shape = tuple[int, ...]


def units_of(shape: Shape) -> int:
    return shape[0] * shape[1] if len(shape) == 2 else shape[0]


def _offsets(segments: Segments, shapes: Mapping[str, Shape], size: Callable[[Shape], int],
             where: str) -> tuple[dict[str, int], int]:
    """Start of each port in a widest input made of ``segments``, and its total size."""
    offsets, start = {}, 0
    for segment in segments:
        missing = [p for p in segment if p not in shapes]
        if missing:
            raise ValueError(f"supernet site {where!r}: port {missing[0]!r} is read before any site writes it")
        for port in segment:
            offsets[port] = start
        start += max(size(shapes[p]) for p in segment)
    return offsets, start


def _fields(shape: Shape) -> int:
    if len(shape) != 2:
        raise ValueError(f"a field segment holds a flat port of shape {shape}")
    return shape[0]


def offset_of(offsets: dict[str, int], port: str, where: str) -> int:
    if port not in offsets:
        raise ValueError(f"supernet site {where!r} has no input column for port {port!r}")
    return offsets[port]


@dataclass
class Value:
    """A tensor flowing through a path: its port and the positions of its units/fields in that port."""

    port: str
    pos: torch.Tensor
    is_field: bool


class SharedBlock(nn.Module):
    """One site at its widest: the projection of a field op's flat inputs to tokens, and the block."""

    def __init__(self, site: Site, shapes: Mapping[str, Shape], dim: int) -> None:
        super().__init__()
        self.site, self.dim = site, dim
        cls = get_block_class(site.op)
        self.field_off, fields = _offsets(site.fields, shapes, _fields, site.key)
        self.flat_off, units = _offsets(site.flats, shapes, units_of, site.key)
        self.left_off, left_units = _offsets(site.left, shapes, units_of, site.key)
        self.fields = fields
        self.proj: MaskedLinear | None = None
        if cls.in_kind == SEQUENCE:  # a history, (max_len, D): nothing to lay out
            if site.sequence not in shapes:
                raise ValueError(f"supernet site {site.key!r}: no history {site.sequence!r} in the data")
            in_shape: Shape = shapes[site.sequence]
        elif cls.in_kind == FIELD:
            if units:
                self.proj = MaskedLinear(units, site.tokens * dim)
                fields += site.tokens
            in_shape = (fields, dim)
        elif cls.num_inputs == 2:
            in_shape = (left_units, units)
        else:
            in_shape = (units,)
        in_shape, params = widest_params(site.op, in_shape, dict(site.params))
        self.block = build_block(site.op, in_shape, params)

    def positions(self, inputs: list[Value], tokens: int) -> tuple[InPos, torch.Tensor | None]:
        """Where a gene's inputs sit in the widest input: block positions, projection columns."""
        key = self.site.key
        units = [v.pos if not v.is_field else flat_positions(v.pos, self.dim) for v in inputs]
        cls = get_block_class(self.site.op)
        if cls.in_kind == SEQUENCE:
            return inputs[0].pos, None  # the history's positions, all of them
        if cls.in_kind == FIELD:
            field_pos = [offset_of(self.field_off, v.port, key) + v.pos for v in inputs if v.is_field]
            flat_cols = [offset_of(self.flat_off, v.port, key) + u for v, u in zip(inputs, units) if not v.is_field]
            if not flat_cols:
                return torch.cat(field_pos), None
            return torch.cat([*field_pos, self.fields + torch.arange(tokens)]), torch.cat(flat_cols)
        cols = [offset_of(self.flat_off, v.port, key) + u for v, u in zip(inputs, units)]
        if cls.num_inputs == 2:
            left = offset_of(self.left_off, inputs[0].port, key) + units[0]
            return (left, torch.cat(cols[1:]) if len(cols) > 1 else cols[0]), None
        return torch.cat(cols), None


class SupernetHead(nn.Module):
    """The head at its widest: hidden layers of the widest widths, one output layer per depth.

    The output layers' weights start at zero, so every path starts from one constant prediction.
    Randomly initialized, paths whose head reads large unnormalized features (dot products, FM)
    start with an NE far above 1, and their gradients swamp the weights every other path shares.
    That prediction is 0.5 until :meth:`start_at` sets it to the training click rate.
    """

    def __init__(self, site: HeadSite, shapes: Mapping[str, Shape], *, norms: bool = False) -> None:
        super().__init__()
        self.offsets, units = _offsets(site.flats, shapes, units_of, "head")
        sizes = [units, *site.widths]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        # With norm choices: one affine map per hidden layer, shared by its layer and batch norms.
        self.norms = nn.ModuleList(nn.LayerNorm(b) for b in site.widths) if norms else None
        self.outputs = nn.ModuleDict({str(d): nn.Linear(sizes[d], 1) for d in site.depths})
        for out in self.outputs.values():
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)

    @torch.no_grad()
    def start_at(self, ctr: float) -> None:
        """Every output layer's bias at the log-odds of ``ctr``: each path starts at the base rate,
        as a trained model does (:func:`~rankitect.train.loop.start_at_base_rate`). At 0 a path
        would predict 0.5 until its own output layer (one per head depth, stepped only when that
        depth is sampled) had walked to the base rate, and on a short supernet phase the paths of a
        rarely drawn depth would be scored by how far that walk got, not by their features.

        >>> head = SupernetHead(HeadSite((("x",),), (4,), (0, 1)), {"x": (3,)})
        >>> head.start_at(0.2)
        >>> [round(float(out.bias), 4) for out in head.outputs.values()]
        [-1.3863, -1.3863]
        """
        logit = base_rate_logit(ctr)
        for out in self.outputs.values():
            out.bias.fill_(logit)

    def params(self, in_pos: torch.Tensor, widths: tuple[int, ...], take: Take = pick, *, norm: str = "none") -> Params:
        """The weights of ``Head(len(in_pos), widths, norm=norm)``: first units, one output layer per depth."""
        if str(len(widths)) not in self.outputs:
            raise ValueError(f"supernet head has no output layer for {len(widths)} hidden layers")
        if norm != "none" and widths and self.norms is None:
            raise ValueError(f"supernet head has no norm for a head with norm {norm!r}")
        out: Params = {}
        cols: torch.Tensor | int = in_pos
        for i, width in enumerate(widths):
            out.update(linear(f"mlp.{2 * i}.", self.hidden[i], width, cols, take))
            if norm != "none" and self.norms is not None:
                out[f"norms.{i}.weight"] = take(self.norms[i].weight, width)
                out[f"norms.{i}.bias"] = take(self.norms[i].bias, width)
            cols = width
        out.update(linear(f"mlp.{2 * len(widths)}.", self.outputs[str(len(widths))], None, cols, take))
        return out


__all__ = ["SharedBlock", "SupernetHead", "Value", "offset_of", "units_of"]
