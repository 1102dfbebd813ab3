"""The export plan: an architecture and a feature spec checked down to plain, exact Python scalars.

Nothing from a genotype or a feature spec reaches generated source except through
:func:`make_plan`. It re-checks every value itself (it does not trust that an
:class:`~rankitect.space.architecture.Architecture` was validated on construction): ops must be
registered blocks (ours or a user's), each param must have exactly the type of the block's typed
constructor argument (:meth:`~rankitect.blocks.base.Block.param_schema`; ``int`` is exactly
``int``, not ``bool`` nor a subclass with its own ``repr``, so ``repr`` writes a plain literal),
input references are indices or the two raw input names, and ``rocs_share`` is ``None`` or exactly
a ``float`` in (0, 1). Value ranges and string options are the block constructors' own checks,
run when the model is built on the ``meta`` device from the checked values; the shapes and
request counts of every block come from that model. Feature names never enter the plan:
features are renamed by position.
"""

from __future__ import annotations

import collections.abc
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankitect.blocks.base import BLOCKS, block_params, takes_share
from rankitect.data.spec import SIDES, DenseFeature, FeatureSpec, SequenceFeature, SparseFeature
from rankitect.blocks.common import NORMS
from rankitect.space.architecture import RAW_INPUTS, Architecture, BlockGene, HeadGene, history_name, history_ref
from rankitect.space.recipe import DIM_GENES, Recipe
from rankitect.space.builder import RankingModel, build_model, dense_inv_stds, dense_means

KINDS = ("field", "flat", "sequence")
SEQUENCES = (collections.abc.Sequence, list, tuple)

Scalar = Any  # int | bool | str | tuple[str, ...], exact types only
Shape = tuple[int, ...]
Ref = int | str


@dataclass(frozen=True)
class GenePlan:
    """One checked gene: its block class, constructor arguments, adapter arguments and output."""

    op: str
    cls: str
    inputs: tuple[Ref, ...]
    in_shape: Shape
    params: tuple[tuple[str, Scalar], ...]
    request_in: int | tuple[int, int] | None
    in_shapes: tuple[Shape, ...]
    in_requests: tuple[int, ...]
    in_kind: str
    num_inputs: int
    tokens: int
    out_shape: Shape
    takes_share: bool  # whether the block's constructor takes ``rocs_share``


@dataclass(frozen=True)
class HistoryPlan:
    """One history the model reads: its position ``k`` among the spec's sequence features (its input
    ``history[k]`` and its name ``q<k>``), ``max_len``, its own table's ``vocab_size``, and the field
    position (field order) of the sparse feature whose table it shares (``None``: a table of its own)."""

    k: int
    max_len: int
    vocab_size: int
    field: int | None


@dataclass(frozen=True)
class ExportPlan:
    """A whole checked model: embeddings, dense order, genes and head."""

    arch_hash: str
    n_dense: int
    n_sparse: int
    dim: int
    masked: bool
    rocs_share: float | None
    vocab_sizes: tuple[int, ...]  # field order
    sparse_order: tuple[int, ...]  # storage column of each field
    dense_order: tuple[int, ...] | None  # storage column of each dense input when masked
    dense_mean: tuple[float, ...] | None  # training mean of each dense column (storage order); None: as given
    dense_inv_std: tuple[float, ...] | None  # and 1 / its std
    uses_sparse: bool
    uses_dense: bool
    genes: tuple[GenePlan, ...]
    head_inputs: tuple[Ref, ...]
    head_in: int
    head_widths: tuple[int, ...]
    head_requests: tuple[int, ...] | None  # request units of each head input when masked
    head_dropout: float = 0.0
    head_norm: str = "none"
    field_dims: tuple[int, ...] | None = None  # table width of each field (field order); None: all dim
    projected: tuple[tuple[str, tuple[int, ...]], ...] = ()  # group -> its fields, projected to dim
    histories: tuple[HistoryPlan, ...] = ()  # the histories the genes read
    n_sequence: int = 0  # the spec's sequence features (inputs of forward's ``history``)

    @property
    def embedded(self) -> bool:
        """Whether the model looks sparse ids up: for its fields, or for a history sharing a table."""
        return self.uses_sparse or any(h.field is not None for h in self.histories)


def check_int(where: str, value: Any, minimum: int) -> int:
    """``value`` if it is exactly an ``int`` (no ``bool``, no subclass) ``>= minimum``."""
    if type(value) is not int or value < minimum:
        raise ValueError(f"{where}: must be an int >= {minimum}, got {value!r}")
    return value


def check_bool(where: str, value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{where}: must be a bool, got {value!r}")
    return value


def check_share(where: str, value: Any) -> float | None:
    """``value`` if it is ``None`` or exactly a ``float`` (no subclass) in the open interval (0, 1)."""
    if value is None:
        return None
    if type(value) is not float or not 0.0 < value < 1.0:  # NaN fails the comparison
        raise ValueError(f"{where}: must be None or a float in (0, 1), got {value!r}")
    return value


def check_choice(where: str, value: Any, options: Sequence[str]) -> str:
    """The allowed option equal to ``value`` (our own copy), if ``value`` is exactly a ``str``."""
    if type(value) is not str or value not in options:
        raise ValueError(f"{where}: must be one of {list(options)}, got {value!r}")
    return options[list(options).index(value)]


def check_param(where: str, value: Any, hint: Any) -> Scalar:
    """``value`` if its type is exactly what the constructor's annotation ``hint`` names (``int``,
    ``bool``, ``float``, ``str``, a ``Literal``, an optional or a sequence of those); a list
    becomes a tuple."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (int, bool, str):
        if type(value) is not hint:
            raise ValueError(f"{where}: must be {'an' if hint is int else 'a'} {hint.__name__}, got {value!r}")
        return value
    if hint is float:
        if type(value) is not float or not math.isfinite(value):
            raise ValueError(f"{where}: must be a finite float, got {value!r}")
        return value
    if origin is typing.Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            raise ValueError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return check_param(where, value, next(a for a in args if a is not type(None)))
    if origin in SEQUENCES and (len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis)):
        if type(value) not in (list, tuple):
            raise ValueError(f"{where}: must be a list, got {value!r}")
        return tuple(check_param(f"{where}[{j}]", v, args[0]) for j, v in enumerate(value))
    raise ValueError(f"{where}: a param annotated {hint!r} cannot be exported")


def check_params(where: str, op: str, params: Any) -> tuple[tuple[str, Scalar], ...]:
    """Every gene param of ``op`` present and checked against its annotation; no other key."""
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}: must be a mapping, got {params!r}")
    schema = BLOCKS[op].param_schema()
    keys = list(params.keys())
    for key in keys:
        if type(key) is not str or key not in schema:
            raise ValueError(f"{where}: unknown param {key!r} for op {op!r}; accepted: {sorted(schema)}")
    late = {n: p.default for n, p in block_params(op).items() if n in BLOCKS[op].late_params}
    missing = sorted(set(schema) - set(keys) - set(late))
    if missing:
        raise ValueError(f"{where}: missing params {missing} for op {op!r}")
    # A late param (added after genotypes were first stored) that is missing takes its default.
    values = {**late, **{k: params[k] for k in keys}}
    return tuple((key, check_param(f"{where}[{key!r}]", values[key], hint)) for key, hint in sorted(schema.items()))


def check_ref(where: str, ref: Any, limit: int) -> Ref:
    """A raw input name (our own copy), ``history:q<k>`` (a history renamed by position), or an exact
    int index below ``limit``."""
    if type(ref) is str and ref in RAW_INPUTS:
        return check_choice(where, ref, RAW_INPUTS)
    name = history_name(ref) if type(ref) is str else None
    if name is not None and name[:1] == "q" and name[1:].isdigit() and name[1:] == str(int(name[1:])):
        return history_ref(f"q{int(name[1:])}")
    if type(ref) is int and 0 <= ref < limit:
        return ref
    raise ValueError(f"{where}: must be an index below {limit}, one of {RAW_INPUTS} or 'history:q<k>', got {ref!r}")


def check_refs(where: str, refs: Any, limit: int) -> tuple[Ref, ...]:
    if type(refs) not in (list, tuple) or not refs:
        raise ValueError(f"{where}: must be a non-empty list of inputs, got {refs!r}")
    return tuple(check_ref(f"{where}[{j}]", r, limit) for j, r in enumerate(refs))


def renamed_histories(arch: Architecture, spec: FeatureSpec) -> Architecture:
    """``arch`` with each history reference renamed by position (``history:clicks`` ->
    ``history:q0``), as :func:`clean_spec` renames the features."""
    names = {history_ref(f.name): history_ref(f"q{k}") for k, f in enumerate(spec.sequence)}
    if not any(history_name(r) is not None for g in arch.blocks for r in g.inputs):
        return arch
    blocks = tuple(BlockGene(g.op, tuple(names.get(r, r) if isinstance(r, str) else r for r in g.inputs), g.params,
                             g.tokens) for g in arch.blocks)
    return Architecture(blocks, arch.head, arch.embedding_dim, arch.rocs, arch.rocs_share, arch.recipe)


def clean_architecture(arch: Any) -> Architecture:
    """A new :class:`Architecture` made only of checked values (it validates itself once more)."""
    if not isinstance(arch, Architecture):
        raise ValueError(f"expected an Architecture, got {type(arch).__name__}")
    if type(arch.blocks) not in (list, tuple):
        raise ValueError(f"blocks: must be a list of genes, got {arch.blocks!r}")
    blocks = []
    for i, gene in enumerate(arch.blocks):
        if not isinstance(gene, BlockGene):
            raise ValueError(f"blocks[{i}]: must be a BlockGene, got {type(gene).__name__}")
        op = check_choice(f"blocks[{i}].op", gene.op, tuple(BLOCKS))
        params = check_params(f"blocks[{i}].params", op, gene.params)
        blocks.append({
            "op": op,
            "inputs": list(check_refs(f"blocks[{i}].inputs", gene.inputs, i)),
            "params": {k: list(v) if type(v) is tuple else v for k, v in params},
            "tokens": check_int(f"blocks[{i}].tokens", gene.tokens, 1),
        })
    head = arch.head
    if not isinstance(head, HeadGene):
        raise ValueError(f"head: must be a HeadGene, got {type(head).__name__}")
    if type(head.widths) not in (list, tuple):
        raise ValueError(f"head.widths: must be a list of ints, got {head.widths!r}")
    clean = {
        "blocks": blocks,
        "head": {
            "inputs": list(check_refs("head.inputs", head.inputs, len(blocks))),
            "widths": [check_int(f"head.widths[{j}]", w, 1) for j, w in enumerate(head.widths)],
            "dropout": check_param("head.dropout", head.dropout, float),
            "norm": check_choice("head.norm", head.norm, NORMS),
        },
        "embedding_dim": check_int("embedding_dim", arch.embedding_dim, 1),
        "rocs": check_bool("rocs", arch.rocs),
        "recipe": clean_recipe(arch.recipe),
    }
    share = check_share("rocs_share", arch.rocs_share)
    if share is not None:
        clean["rocs_share"] = share
    return Architecture.from_dict(clean)


def clean_recipe(recipe: Any) -> dict[str, Any]:
    """The recipe's genes as checked scalars (only the table widths reach the source)."""
    if not isinstance(recipe, Recipe):
        raise ValueError(f"recipe: must be a Recipe, got {type(recipe).__name__}")
    out: dict[str, Any] = {}
    for name in DIM_GENES:
        value = getattr(recipe, name)
        if value is not None:
            out[name] = check_int(f"recipe.{name}", value, 1)
    for name in ("embedding_l2", "lr_dense", "lr_sparse"):
        out[name] = check_param(f"recipe.{name}", getattr(recipe, name), float)
    return out


def clean_spec(spec: Any) -> FeatureSpec:
    """A spec of the same vocabularies and sides (checked) whose features are named by position."""
    if not isinstance(spec, FeatureSpec):
        raise ValueError(f"expected a FeatureSpec, got {type(spec).__name__}")
    sparse = tuple(
        SparseFeature(
            f"s{j}",
            check_int(f"sparse[{j}].vocab_size", f.vocab_size, 2),
            side=check_choice(f"sparse[{j}].side", f.side, SIDES),
        )
        for j, f in enumerate(spec.sparse)
    )
    dense = tuple(
        DenseFeature(f"d{j}", side=check_choice(f"dense[{j}].side", f.side, SIDES), mean=float(f.mean), std=float(f.std))
        for j, f in enumerate(spec.dense)
    )
    names = [f.name for f in spec.sparse]
    sequence = tuple(
        SequenceFeature(f"q{k}", check_int(f"sequence[{k}].max_len", f.max_len, 1),
                        check_int(f"sequence[{k}].vocab_size", f.vocab_size, 2),
                        shares=None if f.shares is None else f"s{names.index(f.shares)}")
        for k, f in enumerate(spec.sequence)
    )
    return FeatureSpec(dense=dense, sparse=sparse, sequence=sequence)


def request_first(sides: Sequence[str]) -> tuple[int, ...]:
    """Storage positions, request side first (stable): the field order of the builder."""
    return tuple(j for j, s in enumerate(sides) if s == "request") + tuple(
        j for j, s in enumerate(sides) if s != "request"
    )


def make_plan(arch: Architecture, spec: FeatureSpec) -> ExportPlan:
    """Check ``arch`` and ``spec`` and read every shape from the rankitect model built on ``meta``."""
    clean, data = clean_architecture(renamed_histories(arch, spec)), clean_spec(spec)
    vocab = tuple(f.vocab_size for f in data.sparse)
    sparse_sides, dense_sides = tuple(f.side for f in data.sparse), tuple(f.side for f in data.dense)
    model = build_model(clean, data, device="meta")
    standardized = clean.uses("dense") and not model.standardize.identity
    D, masked = clean.embedding_dim, clean.rocs
    shapes: dict[Ref, Shape] = {"sparse": (len(vocab), D), "dense": (len(dense_sides),)}
    n_request_sparse = sum(s == "request" for s in sparse_sides)
    n_request_dense = sum(s == "request" for s in dense_sides)
    requests: dict[Ref, int] = {"sparse": n_request_sparse if masked else 0, "dense": n_request_dense if masked else 0}
    histories = _history_plans(clean, data)
    for h in histories:  # a history is request side
        shapes[history_ref(f"q{h.k}")], requests[history_ref(f"q{h.k}")] = (h.max_len, D), h.max_len if masked else 0
    genes = []
    for i, gene in enumerate(clean.blocks):
        plan = _gene_plan(i, gene, model, shapes, requests)
        genes.append(plan)
        shapes[i], requests[i] = plan.out_shape, check_int(f"blocks[{i}].request_out", model.blocks[i].request_out, 0)
    order = request_first(sparse_sides)
    head_in = sum(s[0] if len(s) == 1 else s[0] * s[1] for s in (shapes[r] for r in clean.head.inputs))
    head_requests = None
    if masked:
        head_requests = tuple(check_int(f"head.requests[{j}]", r, 0) for j, r in enumerate(model.head_r))
    return ExportPlan(
        arch_hash=_hex(clean.hash),
        n_dense=len(dense_sides),
        n_sparse=len(vocab),
        dim=D,
        masked=masked,
        rocs_share=check_share("rocs_share", clean.rocs_share),
        vocab_sizes=tuple(vocab[j] for j in order),
        sparse_order=order,
        dense_order=request_first(dense_sides) if masked else None,
        dense_mean=tuple(dense_means(data)) if standardized else None,
        dense_inv_std=tuple(dense_inv_stds(data)) if standardized else None,
        uses_sparse=clean.uses("sparse"),
        uses_dense=clean.uses("dense"),
        genes=tuple(genes),
        head_inputs=clean.head.inputs,
        head_in=head_in,
        head_widths=clean.head.widths,
        head_requests=head_requests,
        head_dropout=clean.head.dropout,
        head_norm=clean.head.norm,
        histories=histories,
        n_sequence=len(data.sequence),
        **_embedding_plan(model),
    )


def _history_plans(arch: Architecture, spec: FeatureSpec) -> tuple[HistoryPlan, ...]:
    """The histories ``arch`` reads (renamed ``q<k>``), checked against the clean ``spec``."""
    fields = [f.name for f in spec.sparse_in_field_order()]
    plans = []
    for name in arch.histories():
        f = spec.sequence_feature(name)
        plans.append(HistoryPlan(k=check_int("history", int(name[1:]), 0), max_len=f.max_len, vocab_size=f.vocab_size,
                                 field=None if f.shares is None else fields.index(f.shares)))
    return tuple(plans)


def _embedding_plan(model: RankingModel) -> dict[str, Any]:
    """Table widths and projected groups of the model's embedding, checked (all at ``dim``: none)."""
    emb = model.embedding
    if emb is None or not emb.projected:
        return {}
    dims = tuple(check_int(f"embedding.dims[{k}]", d, 1) for k, d in enumerate(emb.dims))
    projected = tuple(
        (check_choice("embedding.group", g, tuple(emb.projections)),
         tuple(check_int(f"embedding.projected[{g!r}]", k, 0) for k in fields))
        for g, fields in emb.projected.items()
    )
    return {"field_dims": dims, "projected": projected}


def _gene_plan(
    i: int, gene: Any, model: RankingModel, shapes: Mapping[Ref, Shape], requests: Mapping[Ref, int]
) -> GenePlan:
    adapter, block = model.adapters[i], model.blocks[i]
    where = f"blocks[{i}]"
    request_in = adapter.request_in
    if request_in is not None and type(request_in) is not int:
        request_in = tuple(check_int(f"{where}.request_in", r, 0) for r in request_in)
    elif request_in is not None:
        request_in = check_int(f"{where}.request_in", request_in, 0)
    cls = BLOCKS[gene.op]
    return GenePlan(
        op=gene.op,
        cls=_class_name(f"{where}.op", cls),
        inputs=gene.inputs,
        in_shape=_shape(f"{where}.in_shape", adapter.out_shape),
        params=check_params(f"{where}.params", gene.op, gene.params),
        request_in=request_in,
        in_shapes=tuple(shapes[r] for r in gene.inputs),
        in_requests=tuple(requests[r] for r in gene.inputs),
        in_kind=check_choice(f"{where}.in_kind", cls.in_kind, KINDS),
        num_inputs=check_int(f"{where}.num_inputs", cls.num_inputs, 1),
        tokens=gene.tokens,
        out_shape=_shape(f"{where}.out_shape", block.out_shape),
        takes_share=check_bool(f"{where}.takes_share", takes_share(gene.op)),
    )


def _class_name(where: str, cls: type) -> str:
    """The name of a block class that the bundle defines at its top level."""
    name = cls.__name__
    if not name.isidentifier() or cls.__qualname__ != name:
        raise ValueError(f"{where}: block class {cls.__qualname__!r} must be defined at the top level of its module")
    return name


def _shape(where: str, shape: Any) -> Shape:
    return tuple(check_int(f"{where}[{j}]", s, 1) for j, s in enumerate(shape))


def _hex(text: str) -> str:
    if type(text) is not str or not text or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"architecture hash must be lowercase hex, got {text!r}")
    return text


__all__ = ["ExportPlan", "GenePlan", "HistoryPlan", "check_param", "make_plan"]
