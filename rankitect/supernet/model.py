"""The weight-sharing supernet of a preset space, for one-shot and differentiable search.

Every op of every choice site is built once, through :func:`~rankitect.blocks.build_block`, at its
widest (largest widths, token counts, ranks, depths and every optional part), and every input it
can read has columns of its own (:mod:`rankitect.supernet.layout`). A *path* is a sample of
the space (one option per label); ``supernet(batch, path)`` runs the architecture ``decode(path)``
with each gene's weights cut from its site's widest block: the first units of each layer (NASRec's
masks on the first units, computed by slicing so that dead units cost nothing) and the columns of
the inputs actually read (NASRec's input gates). The cut is exact: :meth:`Supernet.extract` copies
the same slices into ``build_model(arch)``, and that standalone model computes the same logits.

For DNAS, ``gates`` maps labels to scalars (straight-through Gumbel-softmax samples, forward value
1) that scale the outputs and inputs each label decides, so the loss has a gradient in every label.

Recipe genes (:mod:`rankitect.space.recipe_space`): the embedding tables are as wide as the widest
table-width option, and a path's table width is the first columns of each table, projected to
``D`` by the first columns of its group's widest projection when it is not ``D`` wide. Dropout and
normalization are a path's choices like any other: its blocks and head run with the path's dropout
(in training only) and norms, each norm's affine map cut from the widest norm's. Batch norms in the
supernet normalize with the batch's statistics in training and evaluation alike (a running mean
shared by every path would fit none), so a cut model's batch norms start from fresh running
statistics. In training, a path's dropout draws come from the supernet's own seeded sequence (one
seed per forward), not from the global random state: a seeded search draws the same masks
whatever ran before it. Learning rates and embedding L2 do not enter the supernet: it trains at the configured
rates without L2 whatever a path says (in DNAS their labels get no gradient and keep the start's
values); they are searched when candidates are trained on their own.

>>> import numpy as np
>>> from rankitect.space import get_space
>>> from rankitect.space.testing import tiny_batch, tiny_spec
>>> space = get_space("nasrec", num_blocks=2, widths=(8, 16), tokens=(2, 4), embedding_dim=4, merge_tokens=2)
>>> supernet = Supernet(space, tiny_spec())
>>> _ = [torch.nn.init.normal_(p) for p in supernet.head.parameters()]  # the output layers start at 0
>>> path = {**space.sample(np.random.default_rng(0)), "recipe.norm": "layernorm"}  # see batch norms below
>>> batch = tiny_batch(tiny_spec(), 3)
>>> torch.allclose(supernet.eval()(batch, path), supernet.extract(path).eval()(batch), atol=1e-6)
True
>>> supernet.path_flops(path) == supernet.extract(path).flops()
True
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rankitect.blocks.base import FIELD, Block, build_block, get_block_class
from rankitect.space.embedding import SparseEmbedding
from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture, InputRef, history_ref
from rankitect.space.builder import DenseStandardizer, Head, InputAdapter, RankingModel, build_model
from rankitect.space.recipe import vocab_group
from rankitect.space.recipe_space import PREFIX
from rankitect.space.space import SearchSpace
from rankitect.supernet.layout import Layout, Role
from rankitect.supernet.presets import layout_for
from rankitect.supernet.widest import SharedBlock, SupernetHead, Value, offset_of, units_of
from rankitect.supernet.cut import Params, Take, flat_positions, pick, slice_block
from rankitect.supernet.stem import (
    has_head_norms, history_flops, history_state, path_fields, path_histories, recipe_gates, stem_flops, stem_state,
    table_widths,
)
from rankitect.supernet.steps import GeneStep, MixedOp, PathPlan, scale

Shape = tuple[int, ...]
Path = Mapping[str, Any]


def _shape_only(t: torch.Tensor, *index: Any) -> torch.Tensor:
    """A cut of ``t`` on the meta device: its shape, without copying any weight."""
    return pick(t.detach().to("meta"), *(i.to("meta") if isinstance(i, torch.Tensor) else i for i in index))


def _meta_buffers(module: nn.Module) -> bool:
    """Whether ``module`` holds buffers on the meta device (values a forward would need)."""
    return any(b.is_meta for b in module.buffers())


def _batch_statistics(module: nn.Module) -> nn.Module:
    """``module`` with its batch norms normalizing by the batch's statistics in training and
    evaluation alike (no running statistics: see the module docstring)."""
    for sub in module.modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            sub.running_mean = sub.running_var = sub.num_batches_tracked = None
            sub.track_running_stats = False
    return module


def _key(path: Path) -> tuple[tuple[str, Any], ...]:
    """A hashable key of a path (its items in label order)."""
    return tuple(sorted(path.items(), key=lambda kv: kv[0]))


def _site_name(key: str) -> tuple[str, str]:
    """``"b3.flat/mlp" -> ("b3_flat", "mlp")``; a site without options has the option ``"only"``."""
    site, _, option = key.partition("/")
    return site.replace(".", "_"), option or "only"


class Supernet(nn.Module):
    """Every op of ``space`` at its widest, sharing weights; ``forward(batch, path)`` runs one path.

    Args:
        space: a preset space (``nasrec`` or ``engineer``).
        spec: the feature spec of the data.
        layout: the preset's layout (default: :func:`~rankitect.supernet.presets.layout_for`).
        cache_size: planned paths and template modules kept (least recently used dropped).
    """

    def __init__(self, space: SearchSpace, spec: FeatureSpec, *, layout: Layout | None = None,
                 cache_size: int = 512) -> None:
        super().__init__()
        self.space, self.spec = space, spec
        self.layout = layout if layout is not None else layout_for(space, spec)
        self.dim = self.layout.embedding_dim
        self.table_width, projected = table_widths(space, self.dim)
        self.embedding = SparseEmbedding(spec, self.table_width)
        self.field_groups = [vocab_group(f.vocab_size) for f in spec.sparse_in_field_order()]
        self.projections = nn.ModuleDict({g: nn.Linear(self.table_width, self.dim, bias=False)
                                          for g in dict.fromkeys(self.field_groups) if g in projected})
        self.standardize = DenseStandardizer(spec)
        shapes: dict[str, Shape] = {"sparse": (spec.n_sparse, self.dim)}
        if spec.n_dense:
            shapes["dense"] = (spec.n_dense,)
        # The history the space routes (engineer's ``history`` option): (max_len, D); an own table if it shares none.
        routed = getattr(space, "history", None)
        self.histories = [spec.sequence_feature(routed.name)] if routed is not None else []
        self.history_tables = nn.ModuleDict({f.name: nn.Embedding(f.vocab_size, self.dim, sparse=True)
                                             for f in self.histories if f.shares is None})
        shapes.update({history_ref(f.name): (f.max_len, self.dim) for f in self.histories})
        grouped: dict[str, dict[str, SharedBlock]] = {}
        for site in self.layout.sites():
            shared = SharedBlock(site, shapes, self.dim)
            name, option = _site_name(site.key)
            grouped.setdefault(name, {})[option] = shared
            for port in site.out:  # a port is as wide as the widest site that writes it
                old = shapes.get(port, (0, *shared.block.out_shape[1:]))
                shapes[port] = (max(old[0], shared.block.out_shape[0]), *shared.block.out_shape[1:])
        self.ops = nn.ModuleDict({name: MixedOp(options) for name, options in grouped.items()})
        self.head = SupernetHead(self.layout.head(), shapes, norms=has_head_norms(space))
        self.port_shapes = shapes
        self.cache_size = cache_size
        self._plans: OrderedDict[Any, PathPlan] = OrderedDict()
        self._templates: OrderedDict[Any, nn.Module] = OrderedDict()
        self._flops: OrderedDict[Any, int] = OrderedDict()
        self._decoded: OrderedDict[Any, Architecture] = OrderedDict()
        # Dropout draws in training: seed ``draw_seed + forwards`` (drawn from the random state the
        # supernet is built under, so a seeded build draws the same masks).
        self.draw_seed = int(torch.randint(2**62, (), device="cpu"))
        self.recipe_gates = recipe_gates(space, self.field_groups)
        self.forwards = 0

    # --- planning a path ------------------------------------------------------------------------

    def plan(self, path: Path) -> PathPlan:
        """The steps of ``path`` (cached): decode, roles, template modules and weight positions."""
        key = _key(path)
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        arch = self._decode(path, key)
        if arch.rocs:
            raise ValueError("supernet: ROCS-masked architectures are not supported")
        roles, head_gates = self.layout.roles(path, arch)
        values: dict[InputRef, Value] = {"sparse": Value("sparse", torch.arange(self.spec.n_sparse), True)}
        if self.spec.n_dense:
            values["dense"] = Value("dense", torch.arange(self.spec.n_dense), False)
        for f in self.histories:  # a history: its positions, read whole by its block
            values[history_ref(f.name)] = Value(history_ref(f.name), torch.arange(f.max_len), True)
        steps = [self._plan_gene(arch, i, role, values) for i, role in enumerate(roles)]
        head_inputs = [values[r] for r in arch.head.inputs]
        pos = [offset_of(self.head.offsets, v.port, "head")
               + (flat_positions(v.pos, self.dim) if v.is_field else v.pos) for v in head_inputs]
        head_pos = torch.cat(pos)
        head = self._head_template(arch, len(head_pos))
        plan = PathPlan(arch, steps, head, head_pos, head_gates)
        self._check(head, self.head.params(head_pos, arch.head.widths, _shape_only, norm=arch.head.norm), "head")
        self._plans[key] = plan
        if len(self._plans) > self.cache_size:
            self._plans.popitem(last=False)
        return plan

    def _head_template(self, arch: Architecture, units: int, *, meta: bool = False) -> Head:
        h = arch.head
        return self._template(("head", units, h.widths, h.dropout, h.norm),
                              lambda: Head(units, h.widths, dropout=h.dropout, norm=h.norm), meta=meta)

    def _plan_gene(self, arch: Architecture, i: int, role: Role, values: dict[InputRef, Value]) -> GeneStep:
        gene = arch.blocks[i]
        cls = get_block_class(gene.op)
        inputs = [values[r] for r in gene.inputs]
        adapter, block = self._gene_templates(gene, [(len(v.pos), self.dim) if v.is_field else (len(v.pos),)
                                                     for v in inputs])
        site, option = _site_name(role.key)
        shared = self.ops[site].options[option]
        in_pos, proj_cols = shared.positions(inputs, gene.tokens)
        step = GeneStep(site, option, role, gene.inputs, adapter, block, gene.tokens, in_pos, proj_cols)
        block_params, out_pos = slice_block(gene.op, shared.block, block, in_pos, _shape_only)
        self._check(adapter, step.adapter_params(shared, _shape_only), f"blocks[{i}] adapter")
        self._check(block, block_params, f"blocks[{i}] ({gene.op})")
        if int(out_pos.max()) >= self.port_shapes[role.port][0]:
            raise ValueError(f"supernet: blocks[{i}] writes past the width of port {role.port!r}")
        values[i] = Value(role.port, out_pos, cls.out_kind == FIELD)
        return step

    def _gene_templates(self, gene: Any, shapes: list[Shape], *, meta: bool = False) -> tuple[InputAdapter, Block]:
        """The adapter and block templates of ``gene`` for inputs of ``shapes`` (``meta``: sizes only,
        built on the meta device, for costing)."""
        cls = get_block_class(gene.op)
        adapter = self._template(
            ("adapter", tuple(shapes), cls.in_kind, cls.num_inputs, gene.tokens),
            lambda: InputAdapter(shapes, [0] * len(shapes), in_kind=cls.in_kind, num_inputs=cls.num_inputs,
                                 tokens=gene.tokens, dim=self.dim, masked=False), meta=meta,
        )
        block = self._template(("block", gene.op, adapter.out_shape, gene.params),
                               lambda: build_block(gene.op, adapter.out_shape, dict(gene.params)), meta=meta)
        return adapter, block

    @staticmethod
    def _check(template: nn.Module, params: Params, what: str) -> None:
        """Every weight (and persistent buffer) of the narrow module is cut, with its shape: the slicing
        rules fit the blocks."""
        wanted = {n: tuple(t.shape) for n, t in template.state_dict().items()}
        got = {n: tuple(p.shape) for n, p in params.items()}
        if wanted != got:
            raise ValueError(f"supernet: the cut weights of {what} do not fit: expected {wanted}, got {got}")

    def _template(self, key: Any, build: Callable[[], nn.Module], *, meta: bool = False) -> Any:
        """A module of the path's actual sizes whose weights are placeholders (cut weights replace them).

        Templates are built on the meta device, initializing nothing: one serves both running and
        costing a path. A module with buffers (masks, orders), which the forward reads, is built
        again for real the first time a path runs it (``meta``: only costed, it may stay on meta).
        """
        module = self._templates.get(key)
        if module is not None:
            self._templates.move_to_end(key)
            if meta or not _meta_buffers(module):
                return module
        with torch.random.fork_rng(devices=[]):  # building may draw random numbers; the caller's state is kept
            if module is None:
                with torch.device("meta"):
                    module = _batch_statistics(build())
            if not meta and _meta_buffers(module):
                module = _batch_statistics(build())
        for sub in module.modules():
            for name, p in list(sub.named_parameters(recurse=False)):
                setattr(sub, name, nn.Parameter(torch.empty(p.shape, device="meta"), requires_grad=False))
        self._templates[key] = module
        if len(self._templates) > 4 * self.cache_size:
            self._templates.popitem(last=False)
        return module

    # --- running a path ------------------------------------------------------------------------

    def features(self, batch: Batch, path: Path, gates: Mapping[str, torch.Tensor] | None = None,
                 take: Take = pick) -> torch.Tensor:
        """The head's input of ``path`` on ``batch``: its inputs flattened and concatenated ``(B, W)``."""
        plan = self.plan(path)
        outs: dict[InputRef, Any] = {"dense": self.standardize(batch.dense)}
        histories = [f for f in self.histories if plan.arch.uses(history_ref(f.name))]
        if plan.arch.uses("sparse") or histories:  # the fields are the histories' targets too
            outs["sparse"] = path_fields(self.embedding, self.projections, self.field_groups, self.dim,
                                          batch.sparse, plan.arch.recipe, take)
        outs.update(path_histories(self.embedding, self.projections, self.field_groups, self.dim, batch,
                                   plan.arch.recipe, histories, outs.get("sparse"), self.history_tables, take))
        plan.head.train(self.training)  # templates live outside the module tree: dropout follows the supernet
        for step in plan.steps:
            step.adapter.train(self.training)
            step.block.train(self.training)
        for i, step in enumerate(plan.steps):
            xs = [scale(outs[r], g, gates) for r, g in zip(step.inputs, step.role.input_gates or
                                                              [()] * len(step.inputs))]
            outs[i] = self.ops[step.site](step, xs, gates, take)
        feats = [outs[r].reshape(len(batch), -1) for r in plan.arch.head.inputs]  # (B, N, D) -> (B, N*D)
        return torch.cat(feats, dim=1) if len(feats) > 1 else feats[0]

    def head_params(self, path: Path, take: Take = pick) -> Params:
        """The weights of ``path``'s head cut from the widest head (names as in ``Head``)."""
        plan = self.plan(path)
        return self.head.params(plan.head_pos, plan.arch.head.widths, take, norm=plan.arch.head.norm)

    def forward(self, batch: Batch, path: Path, gates: Mapping[str, torch.Tensor] | None = None,
                take: Take = pick) -> torch.Tensor:
        """Logits ``(B,)`` of the architecture ``decode(path)`` with weights cut from the supernet.

        ``gates`` scale what each label decides (DNAS); ``take(t, *index)`` cuts each weight (default
        :func:`~rankitect.supernet.cut.pick`, differentiable into the supernet's weights).
        """
        plan = self.plan(path)
        if not self.training:
            return self._logits(plan, batch, path, gates, take)
        devices = [batch.dense.device] if batch.dense.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the caller's random state is kept
            torch.manual_seed(self.draw_seed + self.forwards)
            self.forwards += 1
            return self._logits(plan, batch, path, gates, take)

    def _logits(self, plan: PathPlan, batch: Batch, path: Path, gates: Mapping[str, torch.Tensor] | None,
                take: Take) -> torch.Tensor:
        features = self.features(batch, path, gates, take)
        logits = functional_call(plan.head, self.head_params(path, take), (features,))
        return scale(logits, plan.head_gates + self.recipe_gates, gates)

    # --- what a path costs and what it is ---------------------------------------------------------

    def path_flops(self, path: Path) -> int:
        """Forward FLOPs per example of ``decode(path)`` from the blocks' analytic ``flops()``.

        Only sizes are needed (no weights are cut), so costing many paths stays cheap; costs are cached.
        """
        arch = self._decode(path, _key(path))
        key = arch.hash  # paths that differ in inactive labels are one architecture: costed once
        if key not in self._flops:
            self._flops[key] = self._arch_flops(arch)
            if len(self._flops) > 16 * self.cache_size:
                self._flops.popitem(last=False)
        self._flops.move_to_end(key)
        return self._flops[key]

    def _decode(self, path: Path, key: Any) -> Architecture:
        """``space.decode(path)``, remembered for the paths most recently planned or costed."""
        if key not in self._decoded:
            self._decoded[key] = self.space.decode(path)
            if len(self._decoded) > self.cache_size:
                self._decoded.popitem(last=False)
        self._decoded.move_to_end(key)
        return self._decoded[key]

    def _arch_flops(self, arch: Architecture) -> int:
        shapes: dict[InputRef, Shape] = {"sparse": (self.spec.n_sparse, self.dim), "dense": (self.spec.n_dense,)}
        shapes.update({history_ref(f.name): (f.max_len, self.dim) for f in self.histories})
        total = history_flops(arch.recipe, self.field_groups, self.dim,
                              [f for f in self.histories if arch.uses(history_ref(f.name))],
                              self.embedding.feature_names)
        for i, gene in enumerate(arch.blocks):
            adapter, block = self._gene_templates(gene, [shapes[r] for r in gene.inputs], meta=True)
            total += adapter.flops() + block.flops()
            shapes[i] = tuple(block.out_shape)
        units = sum(units_of(shapes[r]) for r in arch.head.inputs)
        head = self._head_template(arch, units, meta=True)
        stem = stem_flops(arch.recipe, self.field_groups, self.dim) if arch.uses("sparse") else 0
        return stem + total + head.flops()

    def as_path(self, arch_or_path: Architecture | Path) -> dict[str, Any]:
        """A path from an architecture of the space (``space.encode``) or a path as is."""
        if isinstance(arch_or_path, Architecture):
            sample = self.space.encode(arch_or_path)
            if sample is None:
                raise ValueError(f"architecture {arch_or_path.hash} is not in space {self.space.name!r}")
            return sample
        return dict(arch_or_path)

    def extract(self, arch_or_path: Architecture | Path) -> RankingModel:
        """A standalone ``build_model(arch)`` holding copies of the weights cut from the supernet."""
        path = self.as_path(arch_or_path)
        plan = self.plan(path)
        model = build_model(plan.arch, self.spec)
        state = {**stem_state(model, self.embedding, self.projections), **history_state(model, self.history_tables)}
        for i, step in enumerate(plan.steps):
            adapter, block = step.params(self.ops[step.site].options[step.option])
            state.update({f"adapters.{i}.{k}": v for k, v in adapter.items()})
            state.update({f"blocks.{i}.{k}": v for k, v in block.items()})
        state.update({f"head.{k}": v for k, v in self.head_params(path).items()})
        # Batch-norm running statistics are the new model's own (the supernet keeps none).
        model.load_state_dict({**model.state_dict(), **{k: v.detach().clone() for k, v in state.items()}}, strict=True)
        return model

    def widest_path(self, rng: np.random.Generator) -> dict[str, Any]:
        """A path through the widest options: every numeric choice (width, tokens, rank, depth) at its
        largest, every other choice (ops, inputs, switches) drawn uniformly."""
        path = self.space.sample(rng)
        for label, choice in self.space.choices.items():
            opts = choice.options
            if label.startswith(PREFIX):  # dropout, L2 and learning rates are no width: drawn like switches
                continue
            if all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in opts):
                path[label] = max(opts)
        return path


__all__ = ["Supernet"]
