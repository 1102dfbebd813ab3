"""The recipe genes of a genotype: per-field embedding dimensions, embedding L2 and learning rates.

Widths and wiring are block genes; how a model's embeddings are sized and how it is trained are
the :class:`Recipe`. Dropout and normalization are params of the blocks that have them (``mlp``,
``attention``) and of the head (:class:`~rankitect.space.architecture.HeadGene`), so each layer
carries its own.

Per-field dimensions go by vocabulary size: every sparse feature falls in one of
:data:`VOCAB_GROUPS` (``small``: at most 100 ids, ``medium``: at most 10,000, ``large``: more),
and each group has its own table width (``None``: the architecture's ``embedding_dim`` ``D``).
Blocks read fields of one width ``D``, so a group narrower or wider than ``D`` is projected to
``D`` by one bias-free Linear shared by the group's fields (:mod:`rankitect.space.embedding`).

Today's values are the defaults (every field at ``D``, no L2, the configured learning rates),
and a recipe enters the genotype's JSON only with the genes that differ from them, so the JSON and
hash of a genotype written before recipes existed do not change.

>>> r = Recipe(dim_small=4, embedding_l2=1e-3)
>>> r.to_dict(), Recipe.from_dict(r.to_dict()) == r, Recipe().to_dict()
({'dim_small': 4, 'embedding_l2': 0.001}, True, {})
>>> [r.field_dim(v, 16) for v in (10, 1000, 10**6)], vocab_group(101)
([4, 16, 16], 'medium')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# (group, largest vocabulary in it); the last group has no upper bound.
VOCAB_GROUPS: tuple[tuple[str, int | None], ...] = (("small", 100), ("medium", 10_000), ("large", None))
GROUP_NAMES = tuple(name for name, _ in VOCAB_GROUPS)
DIM_GENES = tuple(f"dim_{name}" for name in GROUP_NAMES)


def vocab_group(vocab_size: int) -> str:
    """The group of a sparse feature with ``vocab_size`` ids (see :data:`VOCAB_GROUPS`)."""
    for name, top in VOCAB_GROUPS:
        if top is None or vocab_size <= top:
            return name
    raise AssertionError("the last vocabulary group has no bound")


def _check_dim(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"recipe.{name}: must be null or an int >= 1, got {value!r}")
    return value


def _check_float(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"recipe.{name}: must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"recipe.{name}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Recipe:
    """Capacity and training genes that are not a block's.

    Args:
        dim_small: table width of the features with at most 100 ids (``None``: ``embedding_dim``).
        dim_medium: ... with 101 to 10,000 ids.
        dim_large: ... with more.
        embedding_l2: weight of the L2 penalty on the embedding rows a batch looks up:
            ``embedding_l2 * mean_b sum_f ||e_bf||^2`` is added to the training loss (FuxiCTR's
            ``embedding_regularizer``, on the rows used rather than on whole tables).
        lr_dense: multiplier of the configured dense learning rate (``train.lr_dense``).
        lr_sparse: multiplier of the configured embedding learning rate (``train.lr_sparse``).
    """

    dim_small: int | None = None
    dim_medium: int | None = None
    dim_large: int | None = None
    embedding_l2: float = 0.0
    lr_dense: float = 1.0
    lr_sparse: float = 1.0

    def __post_init__(self) -> None:
        for name in DIM_GENES:
            _check_dim(name, getattr(self, name))
        object.__setattr__(self, "embedding_l2", _check_float("embedding_l2", self.embedding_l2, positive=False))
        object.__setattr__(self, "lr_dense", _check_float("lr_dense", self.lr_dense, positive=True))
        object.__setattr__(self, "lr_sparse", _check_float("lr_sparse", self.lr_sparse, positive=True))

    def group_dim(self, group: str, dim: int) -> int:
        """The table width of vocabulary group ``group`` in a model of embedding dimension ``dim``."""
        value = getattr(self, f"dim_{group}")
        return dim if value is None else value

    def field_dim(self, vocab_size: int, dim: int) -> int:
        """The table width of a feature with ``vocab_size`` ids in a model of embedding dimension ``dim``."""
        return self.group_dim(vocab_group(vocab_size), dim)

    def to_dict(self) -> dict[str, Any]:
        """The genes that differ from today's values (an empty dict for the default recipe)."""
        default = Recipe()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    @classmethod
    def from_dict(cls, d: Any) -> Recipe:
        if not isinstance(d, Mapping):
            raise ValueError(f"recipe: must be a JSON object, got {d!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"recipe: unknown keys {unknown}; allowed: {sorted(known)}")
        return cls(**dict(d))





def recipe_params(arch: Any) -> dict[str, Any]:
    """An architecture's recipe, dropout and norm genes as flat run params (MLflow), with today's
    values spelled out: the table width of each vocabulary group, the L2 weight, the learning rate
    multipliers, and the distinct dropouts and norms of the blocks that have them and of the head.

    >>> from rankitect.space.architecture import Architecture, BlockGene, HeadGene
    >>> arch = Architecture((BlockGene("mlp", ("dense",), {"width": 4, "dropout": 0.1}),), HeadGene(widths=(4,)),
    ...                     8, recipe=Recipe(dim_small=4))
    >>> p = recipe_params(arch)
    >>> p["recipe.dim_small"], p["recipe.dim_large"], p["recipe.block_dropout"], p["recipe.block_norm"]
    (4, 8, '0.1', 'layernorm')
    """
    recipe, dim = arch.recipe, arch.embedding_dim
    dropouts = sorted({g.params["dropout"] for g in arch.blocks if "dropout" in g.params})
    norms = sorted({g.params["norm"] for g in arch.blocks if "norm" in g.params})
    out: dict[str, Any] = {f"recipe.dim_{g}": recipe.group_dim(g, dim) for g in GROUP_NAMES}
    out.update({
        "recipe.embedding_l2": recipe.embedding_l2,
        "recipe.lr_dense": recipe.lr_dense,
        "recipe.lr_sparse": recipe.lr_sparse,
        "recipe.block_dropout": ",".join(str(d) for d in dropouts) or "none",
        "recipe.block_norm": ",".join(norms) or "none",
        "recipe.head_dropout": arch.head.dropout,
        "recipe.head_norm": arch.head.norm,
    })
    return out
__all__ = ["DIM_GENES", "GROUP_NAMES", "VOCAB_GROUPS", "Recipe", "recipe_params", "vocab_group"]
