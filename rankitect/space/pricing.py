"""What a genotype takes in memory to train, known before one weight is allocated.

:func:`price` builds the model of a genotype on the ``meta`` device (shapes only) and reads two
things off it, per part (the embedding tables, each block with its input adapter, the head):

* its parameters and buffers, which training keeps as weights, gradients and optimizer state
  (Adam's two moments per dense weight, row-wise Adagrad's one accumulator per embedding row, as
  the trainer keeps them);
* the activations autograd saves for the backward pass, per example: one meta forward at a batch
  of one row and one at two rows, every tensor packed by ``saved_tensors_hooks`` counted once,
  the difference being what each further row adds (weights saved by the matmuls cancel out).

Building is cheap on ``meta`` whatever the widths, but costs time for every layer. A depth gene
(``num_layers``, ``mlp_layers``: any int param named ``*_layers``) above :data:`DEPTH_CAP` is
therefore not built at its value: the block is priced at depth 2 and at depth 1, and the
difference, one more layer alike the others, is counted ``value - 2`` more times. A genotype with
``num_layers: 1000000`` is priced in the time of a two-layer one.

:func:`check_fits` refuses a genotype whose training needs more than ``runtime.memory_budget``,
naming the gene whose lowering shrinks it most (``blocks[3].params.num_layers=1000000``).

>>> from rankitect.space.architecture import Architecture, BlockGene
>>> from rankitect.space.testing import tiny_spec
>>> arch = Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8, "norm": "none"}),), embedding_dim=4)
>>> p = price(arch, tiny_spec())  # mlp 4->8 (40 params), head 8->1 (9 params)
>>> p.params, p.part("blocks[0]").params, p.part("head").params
(49, 40, 9)
>>> p.part("blocks[0]").activation  # per row: the linear's input (4 floats), the ReLU's output (8)
48
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

from rankitect.data.spec import FeatureSpec
from rankitect.errors import UserError
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.params import Params
from rankitect.space.builder import RankingModel, build_model

BYTES = 4  # float32 weights, optimizer state and activations
DEPTH_CAP = 8  # depth genes up to this are built as they are; deeper ones are extrapolated
MAX_SIZE = 2**40  # no int gene above this can be built (tensor sizes are int64)
EMBEDDING, INPUTS, HEAD = "embedding_dim", "inputs", "head"


class OverBudget(UserError):
    """A genotype whose training would need more memory than ``runtime.memory_budget``."""


@dataclass(frozen=True)
class Part:
    """One part of a model: its parameters, buffers and the activations one row adds.

    Args:
        name: ``embedding_dim`` (the tables and their lookups), ``inputs`` (dense inputs),
            ``blocks[i]`` (block ``i`` and its input adapter) or ``head``.
        params: parameters.
        buffers: bytes of buffers (ROCS masks, index maps, dense statistics), kept but not trained.
        rows: embedding rows (one Adagrad accumulator each); 0 outside the tables.
        activation: bytes autograd saves for backward per example.
    """

    name: str
    params: int = 0
    buffers: int = 0
    rows: int = 0
    activation: int = 0

    def bytes(self, batch_size: int | None) -> int:
        """Bytes to train with ``batch_size`` rows a step (``None``: the weights alone, to serve)."""
        if batch_size is None:
            return BYTES * self.params + self.buffers
        if self.name == EMBEDDING:  # sparse gradients; one row-wise Adagrad accumulator per row
            state = BYTES * (self.params + self.rows)
        else:  # weight, gradient, Adam's two moments
            state = 4 * BYTES * self.params
        return state + self.buffers + batch_size * self.activation

    def plus(self, other: Part, times: int = 1) -> Part:
        """This part with ``times`` x ``other``'s numbers added (``other`` may be a difference)."""
        return replace(self, params=self.params + times * other.params, buffers=self.buffers + times * other.buffers,
                       rows=self.rows + times * other.rows, activation=self.activation + times * other.activation)

    def minus(self, other: Part) -> Part:
        return self.plus(other, -1)


@dataclass(frozen=True)
class Price:
    """A genotype's parts; their sums say what training it takes (:meth:`bytes`)."""

    parts: tuple[Part, ...]

    @property
    def params(self) -> int:
        return sum(p.params for p in self.parts)

    @property
    def activation(self) -> int:
        """Bytes saved for backward per example."""
        return sum(p.activation for p in self.parts)

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def bytes(self, batch_size: int | None) -> int:
        return sum(p.bytes(batch_size) for p in self.parts)

    def describe(self, batch_size: int | None) -> str:
        total = self.bytes(batch_size)
        if batch_size is None:
            return f"{total / 1e9:.2f} GB of weights ({self.params:,} params)"
        acts = batch_size * self.activation
        return (f"{total / 1e9:.2f} GB to train ({self.params:,} params: {(total - acts) / 1e9:.2f} GB with gradients "
                f"and optimizer state; {acts / 1e9:.2f} GB of activations for a batch of {batch_size})")


def _is_depth(name: str) -> bool:
    return name == "num_layers" or name.endswith("_layers")


def _check_sizes(arch: Architecture) -> None:
    """Refuse an int gene no tensor can have (sizes are int64), before torch sees it."""
    for name, value in _knobs(arch):
        if isinstance(value, int) and value > MAX_SIZE:
            raise ValueError(f"{name}={value}: above {MAX_SIZE:,}, larger than any tensor can be")


def _knobs(arch: Architecture) -> list[tuple[str, int]]:
    """Every int gene as ``(name, value)``: ``embedding_dim``, ``blocks[i].params.k``, ``blocks[i].tokens``,
    ``head.widths[j]``."""
    out: list[tuple[str, int]] = [(EMBEDDING, arch.embedding_dim)]
    for i, gene in enumerate(arch.blocks):
        out += [(f"blocks[{i}].params.{k}", v) for k, v in gene.params.items()
                if isinstance(v, int) and not isinstance(v, bool)]
        out.append((f"blocks[{i}].tokens", gene.tokens))
    out += [(f"head.widths[{j}]", w) for j, w in enumerate(arch.head.widths)]
    return out


def _with(arch: Architecture, name: str, value: int) -> Architecture:
    """``arch`` with the int gene ``name`` (as :func:`_knobs` names it) set to ``value``."""
    if name == EMBEDDING:
        return replace(arch, embedding_dim=value)
    if name.startswith("head.widths["):
        j = int(name[len("head.widths["):-1])
        widths = list(arch.head.widths)
        widths[j] = value
        return replace(arch, head=HeadGene(arch.head.inputs, tuple(widths)))
    i = int(name[len("blocks["):name.index("]")])
    gene, blocks = arch.blocks[i], list(arch.blocks)
    if name.endswith(".tokens"):
        blocks[i] = replace(gene, tokens=value)
    else:
        key = name.rsplit(".", 1)[1]
        blocks[i] = BlockGene(gene.op, gene.inputs, Params({**gene.params.to_dict(), key: value}), gene.tokens)
    return replace(arch, blocks=tuple(blocks))


def _saved_per_part(model: RankingModel, rows: int) -> dict[str, int]:
    """Bytes autograd saves for backward in each part, in one meta forward of ``rows`` rows."""
    spec, arch = model.spec, model.arch
    saved: dict[int, tuple[str, torch.Tensor]] = {}  # by id, so a tensor saved twice counts once
    current = [INPUTS]

    def enter(name: str) -> Any:
        return lambda *_: current.__setitem__(0, name)

    hooks = [m.register_forward_pre_hook(enter(f"blocks[{i}]"))
             for i, pair in enumerate(zip(model.adapters, model.blocks)) for m in pair]
    hooks.append(model.head.register_forward_pre_hook(enter(HEAD)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.setdefault(id(t), (current[0], t))
        return t

    with torch.device("meta"):
        dense = torch.zeros(rows, spec.n_dense)
        emb = None if model.embedding is None else torch.zeros(rows, spec.n_sparse, arch.embedding_dim,
                                                                requires_grad=True)
        batch = SimpleNamespace(dense=dense, history_padded=lambda name, length: (
            torch.zeros(rows, length, dtype=torch.long), torch.ones(rows, length, dtype=torch.bool)))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model.forward_dense(batch, emb)
        finally:
            for h in hooks:
                h.remove()
    out: dict[str, int] = {}
    for name, t in saved.values():
        out[name] = out.get(name, 0) + t.numel() * t.element_size()
    if emb is not None:  # the lookups' output, kept for the tables' gradient
        out[EMBEDDING] = out.get(EMBEDDING, 0) + emb.numel() * emb.element_size()
    return out


def _measure(arch: Architecture, spec: FeatureSpec) -> dict[str, Part]:
    """Every part of ``arch`` as built (on ``meta``), by name."""
    model = build_model(arch, spec, device="meta")

    def count(modules: list[Any]) -> tuple[int, int]:
        return (sum(p.numel() for m in modules for p in m.parameters()),
                sum(b.numel() * b.element_size() for m in modules for b in m.buffers()))

    parts: dict[str, Part] = {}
    if model.embedding is not None:
        tables = list(model.embedding.parameters())
        parts[EMBEDDING] = Part(EMBEDDING, sum(t.numel() for t in tables), 0, sum(t.shape[0] for t in tables))
    params, buffers = count([model.standardize])
    order = model.dense_order  # the model's own buffer: dense columns request side first
    parts[INPUTS] = Part(INPUTS, params, buffers + order.numel() * order.element_size())
    for i, pair in enumerate(zip(model.adapters, model.blocks)):
        parts[f"blocks[{i}]"] = Part(f"blocks[{i}]", *count(list(pair)))
    parts[HEAD] = Part(HEAD, *count([model.head]))
    per_row = _activations(model)
    for name, part in parts.items():
        parts[name] = replace(part, activation=per_row.get(name, 0))
    return parts


def _activations(model: RankingModel) -> dict[str, int]:
    """Bytes saved for backward per example, per part: from meta forwards of two and three rows (a
    batch norm treats a lone row apart, :class:`~rankitect.blocks.common.BatchNorm`), in
    training mode, else (a block whose training forward reads values, which ``meta`` has not) in
    eval mode; else, for a block no meta forward runs, its output alone (a lower bound)."""
    for training in (True, False):
        model.train(training)
        try:
            one, two = _saved_per_part(model, 2), _saved_per_part(model, 3)
        except (RuntimeError, NotImplementedError):
            continue
        return {name: max(0, two.get(name, 0) - one.get(name, 0)) for name in set(one) | set(two)}
    out = {f"blocks[{i}]": math.prod(block.out_shape) * BYTES for i, block in enumerate(model.blocks)}
    out[HEAD] = BYTES * (sum(model.arch.head.widths) + 1)
    return out


def price(arch: Architecture, spec: FeatureSpec) -> Price:
    """The :class:`Price` of training ``arch`` on ``spec``, depth genes above :data:`DEPTH_CAP`
    extrapolated from depths 2 and 1 (see the module docstring)."""
    _check_sizes(arch)
    deep = [(name, value) for i, gene in enumerate(arch.blocks) for k, value in gene.params.items()
            for name in [f"blocks[{i}].params.{k}"]
            if _is_depth(k) and isinstance(value, int) and not isinstance(value, bool) and value > DEPTH_CAP]
    built = arch
    for name, _ in deep:
        built = _with(built, name, 2)
    parts = _measure(built, spec)
    for name, value in deep:
        block = name[: name.index("]") + 1]
        one = _measure(_with(built, name, 1), spec)[block]
        parts[block] = parts[block].plus(parts[block].minus(one), value - 2)  # value - 2 more layers alike
    return Price(tuple(parts.values()))


def budget_bytes(gb: float | None) -> int | None:
    """``runtime.memory_budget`` in bytes: ``gb`` GB, or half this machine's RAM when ``None``
    (the supernet's budget, :func:`rankitect.supernet.train.memory_budget`)."""
    if gb is not None:
        return int(gb * 1e9)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return None


def blame(arch: Architecture, spec: FeatureSpec, priced: Price, batch_size: int | None) -> str:
    """The int gene (``name=value``) whose lowering to 1 shrinks the bill most; the priciest part
    when no gene can be lowered."""
    total, best, gain = priced.bytes(batch_size), None, 0
    for name, value in _knobs(arch):
        if value <= 1:
            continue
        try:
            lowered = price(_with(arch, name, 1), spec).bytes(batch_size)
        except ValueError:  # not a valid genotype at 1 (e.g. heads no longer divide embedding_dim)
            continue
        if total - lowered > gain:
            best, gain = f"{name}={value}", total - lowered
    if best is not None:
        return best
    worst = max(priced.parts, key=lambda p: p.bytes(batch_size))
    return worst.name


def check_fits(
    arch: Architecture, spec: FeatureSpec, budget_gb: float | None, batch_size: int | None, *, where: str = "",
) -> Price:
    """``arch``'s :class:`Price` if training it with ``batch_size`` rows a step (``None``: only
    holding its weights) fits ``runtime.memory_budget`` (``budget_gb``); else :class:`OverBudget`
    naming the gene at fault, prefixed by ``where`` (e.g. the file)."""
    priced = price(arch, spec)
    budget = budget_bytes(budget_gb)
    if budget is None or priced.bytes(batch_size) <= budget:
        return priced
    gene = blame(arch, spec, priced, batch_size)
    raise OverBudget(f"{where}{gene}: the model needs about {priced.describe(batch_size)}, "
                     f"> runtime.memory_budget ({budget / 1e9:.2f} GB); lower {gene.split('=')[0]}"
                     f"{'' if batch_size is None else ' or train.batch_size'}, or raise runtime.memory_budget")


__all__ = ["DEPTH_CAP", "OverBudget", "Part", "Price", "blame", "budget_bytes", "check_fits", "price"]
