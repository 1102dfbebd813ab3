"""The genotype: an architecture as plain, hashable, JSON-round-trippable data.

An :class:`Architecture` is a list of block genes evaluated in order, a head, and the embedding
dimension. A gene names a registered block op, its inputs and its params; inputs are earlier genes
(by index) or the raw inputs ``"dense"`` (the flat ``(B, n_dense)`` features), ``"sparse"`` (the
field ``(B, n_sparse, D)`` embeddings) and ``"history:<name>"`` (the sequence feature ``<name>``: a
:class:`~rankitect.blocks.sequence.History`, which only a history block reads, as its one input).
How inputs of another kind are adapted (flatten; project to
``tokens`` tokens) is the builder's business (:mod:`rankitect.space.builder`); genes are data only.

Every field tensor in a model has the embedding dimension ``D``, so field inputs always
concatenate along the field axis. Genes are validated on construction; a ``ValueError`` names the
field at fault (``blocks[3].inputs[1]``, ``head.widths[0]``, ...).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Union

import rankitect.blocks  # noqa: F401  (importing the package registers every block)
from rankitect.blocks.base import FIELD, FLAT, SEQUENCE, block_params, get_block_class
from rankitect.blocks.common import NORMS, check_dropout, check_share
from rankitect.errors import DataError
from rankitect.space.params import Params, canonical_params, check_int
from rankitect.space.recipe import DIM_GENES, Recipe

RAW_INPUTS = ("dense", "sparse")
HISTORY_PREFIX = "history:"  # "history:<name>": the sequence feature <name> of the data
# Genotype JSON is read within these: a genotype nests 4 deep and a large one takes a few KB, so
# a deeper or bigger text is not a genotype (and would take the parser's stack or the machine).
MAX_JSON_BYTES = 256 * 1024
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
InputRef = Union[int, str]


def history_ref(name: str) -> str:
    """The input reference of sequence feature ``name``.

    >>> history_ref("clicks"), history_name("history:clicks"), history_name("sparse")
    ('history:clicks', 'clicks', None)
    """
    return HISTORY_PREFIX + name


def history_name(ref: Any) -> str | None:
    """The sequence feature an input reference names, or ``None`` for any other reference."""
    if isinstance(ref, str) and ref.startswith(HISTORY_PREFIX) and ref[len(HISTORY_PREFIX):].isidentifier():
        return ref[len(HISTORY_PREFIX):]
    return None


def _check_input(where: str, ref: Any) -> InputRef:
    if isinstance(ref, str) and (ref in RAW_INPUTS or history_name(ref) is not None):
        return ref
    if isinstance(ref, int) and not isinstance(ref, bool) and ref >= 0:
        return ref
    raise ValueError(f"{where}: must be an earlier block index, one of {RAW_INPUTS} or 'history:<name>', got {ref!r}")


def _check_inputs(where: str, inputs: Any) -> tuple[InputRef, ...]:
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not inputs:
        raise ValueError(f"{where}: must be a non-empty list of inputs, got {inputs!r}")
    refs = tuple(_check_input(f"{where}[{i}]", r) for i, r in enumerate(inputs))
    if len(set(refs)) != len(refs):
        raise ValueError(f"{where}: duplicate inputs in {list(refs)}")
    return refs


@dataclass(frozen=True)
class BlockGene:
    """One block: ``op`` applied to the concatenation of ``inputs``, built with ``params``.

    Args:
        op: a registered block name (:data:`rankitect.blocks.BLOCKS`).
        inputs: earlier gene indices and/or ``"dense"`` / ``"sparse"``, no duplicates.
        params: the block's keyword params; missing ones take the block's defaults.
        tokens: for a field-input op, how many ``D``-dim tokens its flat inputs are projected to
            (together, after concatenation); must stay 1 when the op has no flat input.

    >>> BlockGene("mlp", ["dense"], {"width": 8}).params["num_layers"]
    1
    """

    op: str
    inputs: tuple[InputRef, ...]
    params: Params = field(default_factory=Params)
    tokens: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.op, str):
            raise ValueError(f"op: must be a block name, got {self.op!r}")
        try:
            get_block_class(self.op)
        except ValueError as err:
            raise ValueError(f"op: {err}") from None
        object.__setattr__(self, "inputs", _check_inputs("inputs", self.inputs))
        object.__setattr__(self, "params", canonical_params(self.op, self.params))
        check_int("tokens", self.tokens, 1)

    @property
    def in_kind(self) -> str:
        return get_block_class(self.op).in_kind

    @property
    def out_kind(self) -> str:
        return get_block_class(self.op).out_kind

    def to_dict(self) -> dict[str, Any]:
        """The gene as JSON data; a param the block marks as late (added after genotypes were
        stored, :attr:`~rankitect.blocks.base.Block.late_params`) appears only off its default, so
        older genotypes keep their JSON and hash."""
        params = self.params.to_dict()
        accepted = block_params(self.op)
        for name in get_block_class(self.op).late_params:
            if name in params and params[name] == accepted[name].default:
                del params[name]
        return {"op": self.op, "inputs": list(self.inputs), "params": params, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BlockGene:
        _check_keys("block", d, {"op", "inputs", "params", "tokens"}, {"op", "inputs"})
        return cls(op=d["op"], inputs=tuple(d["inputs"]), params=Params(d.get("params", {})), tokens=d.get("tokens", 1))


@dataclass(frozen=True)
class HeadGene:
    """The final MLP: ``widths`` hidden layers (Linear, ``norm``, ReLU, dropout ``dropout``), then a
    Linear to one logit.

    ``inputs`` are flattened and concatenated; empty means "the last block" (filled in by
    :class:`Architecture`). ``norm`` (``"none"``, ``"layernorm"`` or ``"batchnorm"``) and ``dropout``
    enter the JSON only off their defaults (none, 0), so older genotypes keep their hash.
    """

    inputs: tuple[InputRef, ...] = ()
    widths: tuple[int, ...] = ()
    dropout: float = 0.0
    norm: str = "none"

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm: must be one of {list(NORMS)}, got {self.norm!r}")
        object.__setattr__(self, "dropout", check_dropout(self.dropout, "dropout"))
        inputs = tuple(self.inputs)
        object.__setattr__(self, "inputs", _check_inputs("inputs", inputs) if inputs else ())
        if isinstance(self.widths, (str, bytes)) or not isinstance(self.widths, Sequence):
            raise ValueError(f"widths: must be a list of ints, got {self.widths!r}")
        widths = tuple(check_int(f"widths[{i}]", w, 1) for i, w in enumerate(self.widths))
        object.__setattr__(self, "widths", widths)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"inputs": list(self.inputs), "widths": list(self.widths)}
        if self.dropout:
            d["dropout"] = self.dropout
        if self.norm != "none":
            d["norm"] = self.norm
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HeadGene:
        _check_keys("head", d, {"inputs", "widths", "dropout", "norm"}, set())
        return cls(inputs=tuple(d.get("inputs", ())), widths=tuple(d.get("widths", ())),
                   dropout=d.get("dropout", 0.0), norm=d.get("norm", "none"))

    def with_inputs(self, inputs: tuple[InputRef, ...]) -> HeadGene:
        return HeadGene(inputs=inputs, widths=self.widths, dropout=self.dropout, norm=self.norm)


def _check_keys(what: str, d: Any, allowed: set[str], required: set[str]) -> None:
    if not isinstance(d, Mapping):
        raise ValueError(f"{what}: must be a JSON object, got {d!r}")
    unknown, missing = sorted(set(d) - allowed), sorted(required - set(d))
    if unknown:
        raise ValueError(f"{what}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    if missing:
        raise ValueError(f"{what}: missing keys {missing}")


@dataclass(frozen=True)
class Architecture:
    """A whole model as data: block genes in evaluation order, a head, the embedding dimension.

    Every block's output must be used (by a later block or by the head), so no computation is
    dead. ``rocs`` asks the builder for ROCS masking (request-side fields first). ``rocs_share``
    (only with ``rocs``) is the fraction in (0, 1) of each masked layer's outputs that are request
    side when the layer has request- and candidate-side inputs; ``None`` keeps the share of each
    layer's outputs proportional to its input share. It enters the JSON only when set, so the JSON
    and hash of an architecture without it do not mention it. ``recipe``
    (:class:`~rankitect.space.recipe.Recipe`: per-field embedding widths, embedding L2, learning
    rate multipliers) enters it likewise only with the genes that differ from today's values.

    >>> arch = Architecture(
    ...     blocks=(BlockGene("mlp", ("dense",), {"width": 16}),
    ...             BlockGene("dot", (0, "sparse"), tokens=1)),
    ...     head=HeadGene(inputs=(1, 0), widths=(32,)), embedding_dim=8)
    >>> Architecture.from_json(arch.to_json()) == arch, len(arch.hash)
    (True, 16)
    >>> Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 16}),), embedding_dim=8).head.inputs
    (0,)
    >>> shared = Architecture(arch.blocks, arch.head, 8, rocs=True, rocs_share=0.75)
    >>> '"rocs_share":0.75' in shared.to_json(), "rocs_share" in arch.to_json()
    (True, False)
    """

    blocks: tuple[BlockGene, ...]
    head: HeadGene = field(default_factory=HeadGene)
    embedding_dim: int = 16
    rocs: bool = False
    rocs_share: float | None = None
    recipe: Recipe = field(default_factory=Recipe)

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))
        check_int("embedding_dim", self.embedding_dim, 1)
        if not isinstance(self.recipe, Recipe):
            raise ValueError(f"recipe: must be a Recipe, got {self.recipe!r}")
        at_d = {g: None for g in DIM_GENES if getattr(self.recipe, g) == self.embedding_dim}
        if at_d:  # a table as wide as D is today's default: one genotype (and hash) per model
            object.__setattr__(self, "recipe", replace(self.recipe, **at_d))
        if not isinstance(self.rocs, bool):
            raise ValueError(f"rocs: must be a bool, got {self.rocs!r}")
        self._check_share()
        for i, gene in enumerate(self.blocks):
            if not isinstance(gene, BlockGene):
                raise ValueError(f"blocks[{i}]: must be a BlockGene, got {gene!r}")
            self._check_gene(i, gene)
        if not isinstance(self.head, HeadGene):
            raise ValueError(f"head: must be a HeadGene, got {self.head!r}")
        if not self.head.inputs:
            if not self.blocks:
                raise ValueError("head.inputs: must be given when there are no blocks")
            object.__setattr__(self, "head", self.head.with_inputs((len(self.blocks) - 1,)))
        for j, ref in enumerate(self.head.inputs):
            if isinstance(ref, int) and ref >= len(self.blocks):
                raise ValueError(f"head.inputs[{j}]: block {ref} does not exist ({len(self.blocks)} blocks)")
            if history_name(ref) is not None:
                raise ValueError(f"head.inputs[{j}]: {ref!r} is a history, which only a history block reads")
        used = {r for g in self.blocks for r in g.inputs} | set(self.head.inputs)
        for i in range(len(self.blocks)):
            if i not in used:
                raise ValueError(f"blocks[{i}]: its output is used by no later block and not by the head")

    def _check_share(self) -> None:
        share = self.rocs_share
        if share is None:
            return
        check_share(share, "rocs_share:")
        if not self.rocs:
            raise ValueError(f"rocs_share: {share!r} given but rocs is False (a share needs ROCS masking)")
        object.__setattr__(self, "rocs_share", float(share))  # a plain float (not a numpy scalar) in JSON

    def _check_gene(self, i: int, gene: BlockGene) -> None:
        for j, ref in enumerate(gene.inputs):
            if isinstance(ref, int) and ref >= i:
                raise ValueError(f"blocks[{i}].inputs[{j}]: {ref} is not an earlier block (index >= {i})")
        heads = gene.params.get("num_heads")
        if heads is not None and self.embedding_dim % heads:
            raise ValueError(
                f"blocks[{i}].params['num_heads']: embedding_dim={self.embedding_dim} is not divisible by {heads}"
            )
        reads_history = [history_name(r) is not None for r in gene.inputs]
        if (gene.in_kind == SEQUENCE) != any(reads_history) or (any(reads_history) and len(gene.inputs) != 1):
            raise ValueError(f"blocks[{i}].inputs: a history block ({gene.op!r} takes {gene.in_kind} inputs) reads "
                             f"exactly one 'history:<name>', and only it does; got {list(gene.inputs)}")
        has_flat = any(self.kind_of(r) == FLAT for r in gene.inputs)
        if gene.tokens != 1 and not (gene.in_kind == FIELD and has_flat):
            raise ValueError(f"blocks[{i}].tokens: {gene.tokens} given but op {gene.op!r} projects no flat input")

    def kind_of(self, ref: InputRef) -> str:
        """``"flat"``, ``"field"`` or ``"sequence"``: the kind of an input reference's tensor."""
        if ref == "dense":
            return FLAT
        if ref == "sparse":
            return FIELD
        if history_name(ref) is not None:
            return SEQUENCE
        return self.blocks[int(ref)].out_kind

    def uses(self, raw: str) -> bool:
        """Whether any gene or the head reads the raw input ``"dense"``, ``"sparse"`` or ``"history:<name>"``."""
        return any(raw in g.inputs for g in self.blocks) or raw in self.head.inputs

    def histories(self) -> list[str]:
        """The sequence features the genes read, in order of first use."""
        names = (history_name(r) for g in self.blocks for r in g.inputs)
        return list(dict.fromkeys(n for n in names if n is not None))

    def to_dict(self) -> dict[str, Any]:
        d = {
            "blocks": [g.to_dict() for g in self.blocks],
            "head": self.head.to_dict(),
            "embedding_dim": self.embedding_dim,
            "rocs": self.rocs,
        }
        if self.rocs_share is not None:
            d["rocs_share"] = self.rocs_share
        recipe = self.recipe.to_dict()
        if recipe:
            d["recipe"] = recipe
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Architecture:
        _check_keys("architecture", d, {"blocks", "head", "embedding_dim", "rocs", "rocs_share", "recipe"}, {"blocks"})
        if not isinstance(d["blocks"], list):
            raise ValueError(f"blocks: must be a list, got {d['blocks']!r}")
        genes = []
        for i, g in enumerate(d["blocks"]):
            try:
                genes.append(BlockGene.from_dict(g))
            except ValueError as err:
                raise ValueError(f"blocks[{i}].{err}") from None
        try:
            head = HeadGene.from_dict(d.get("head", {}))
        except ValueError as err:
            raise ValueError(f"head.{err}") from None
        return cls(
            blocks=tuple(genes),
            head=head,
            embedding_dim=d.get("embedding_dim", 16),
            rocs=d.get("rocs", False),
            rocs_share=d.get("rocs_share"),
            recipe=Recipe.from_dict(d.get("recipe", {})),
        )

    def to_json(self, indent: int | None = None) -> str:
        """Canonical JSON (sorted keys; compact unless ``indent`` is given)."""
        if indent is None:
            return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Architecture:
        """The architecture of a genotype JSON text, refused (``ValueError``) beyond
        :data:`MAX_JSON_BYTES` or nested deeper than :data:`MAX_JSON_DEPTH` before it is parsed."""
        check_json_limits(text)
        return cls.from_dict(json.loads(text))

    @cached_property
    def hash(self) -> str:
        """The first 16 hex digits of the sha256 of the canonical JSON: stable across runs."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def check_json_limits(text: str) -> None:
    """Refuse a JSON text longer than :data:`MAX_JSON_BYTES` or nested deeper than
    :data:`MAX_JSON_DEPTH`, without parsing it (the parser recurses once per level).

    >>> check_json_limits('{"a": [[1], "]]]"]}')
    >>> check_json_limits("[" * 40 + "]" * 40)
    Traceback (most recent call last):
    ...
    ValueError: JSON nested deeper than 32 levels; a genotype nests 4 deep
    """
    if len(text) > MAX_JSON_BYTES:
        raise ValueError(f"{len(text):,} characters, more than a genotype's limit of {MAX_JSON_BYTES:,}")
    depth = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub('""', text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels; a genotype nests 4 deep")


def read_genotype(path: str | Path) -> Architecture:
    """The architecture in the genotype JSON file ``path``; a :class:`~rankitect.errors.DataError`
    naming the file when it cannot be read, is too big or too deep, or is not a valid genotype.
    Only the first :data:`MAX_JSON_BYTES` (+1) bytes are ever read."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise ValueError(f"more than a genotype's limit of {MAX_JSON_BYTES:,} bytes")
        return Architecture.from_json(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as err:
        raise DataError(f"not a valid genotype: {err}", path=str(p)) from None
