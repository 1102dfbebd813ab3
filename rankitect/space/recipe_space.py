"""Recipe choices, the same for every preset: table widths, dropout, norms, embedding L2, learning rates.

:class:`~rankitect.space.space.SearchSpace` adds one choice per menu here, labelled
``recipe.<gene>``, after a preset's own choices, and applies them to whatever the preset decodes:
``dropout`` goes to every block that takes one (``mlp``, ``attention``) and to the head, ``norm``
to every ``mlp`` block, ``head_norm`` to the head, and the rest to the
:class:`~rankitect.space.recipe.Recipe`. A preset never sees them: it encodes an architecture with
today's values put back (:func:`strip_recipe`).

Today's values are in every default menu, so the baselines stay points of every space. Table
widths are ``None`` (``D``), a quarter and a half of ``D``, and ``2 D``; the search sizing drops the
menu of a vocabulary group the data has no feature in (:mod:`rankitect.search.proposing.sizing`), whose
choice would change the genotype but not the model.

>>> menus = default_recipe_menus(16)
>>> menus["dim_large"], menus["lr_dense"]
((None, 4, 8, 32), (1.0, 0.5, 2.0))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rankitect.blocks.base import block_params
from rankitect.blocks.common import NORMS, check_dropout
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.recipe import DIM_GENES, Recipe

PREFIX = "recipe."
DROPOUTS = (0.0, 0.1, 0.2, 0.3)
L2S = (0.0, 1e-4, 1e-3, 1e-2)
LR_SCALES = (1.0, 0.5, 2.0)
MLP_NORM = "layernorm"  # today's mlp norm (the block's default)
RECIPE_GENES = (*DIM_GENES, "dropout", "norm", "head_norm", "embedding_l2", "lr_dense", "lr_sparse")


def default_recipe_menus(embedding_dim: int) -> dict[str, tuple[Any, ...]]:
    """The recipe menus of a space of embedding dimension ``embedding_dim`` (today's value first)."""
    D = embedding_dim
    dims = tuple(dict.fromkeys([None, *(d for d in (max(1, D // 4), max(1, D // 2), 2 * D) if d != D)]))
    return {
        **{gene: dims for gene in DIM_GENES},
        "dropout": DROPOUTS,
        "norm": (MLP_NORM, "batchnorm", "none"),
        "head_norm": ("none", "batchnorm", "layernorm"),
        "embedding_l2": L2S,
        "lr_dense": LR_SCALES,
        "lr_sparse": LR_SCALES,
    }


def check_recipe_menus(menus: Mapping[str, Sequence[Any]], embedding_dim: int) -> dict[str, tuple[Any, ...]]:
    """Menus by gene name, each a non-empty list of values the gene accepts; unknown genes refused."""
    if not isinstance(menus, Mapping):
        raise ValueError(f"option 'recipe' must be a mapping of gene -> menu, got {menus!r}")
    out: dict[str, tuple[Any, ...]] = {}
    for gene, menu in menus.items():
        if gene not in RECIPE_GENES:
            raise ValueError(f"option 'recipe': unknown gene {gene!r}; known: {list(RECIPE_GENES)}")
        if isinstance(menu, (str, bytes)) or not isinstance(menu, Sequence) or not menu:
            raise ValueError(f"option 'recipe': the menu of {gene!r} must be a non-empty list, got {menu!r}")
        values = tuple(None if gene in DIM_GENES and v == embedding_dim else v for v in menu)
        for v in values:
            _check_value(gene, v)
        out[gene] = tuple(dict.fromkeys(values))
    return out


def _check_value(gene: str, value: Any) -> None:
    try:
        if gene in ("dropout",):
            check_dropout(value, "dropout")
        elif gene in ("norm", "head_norm"):
            if value not in NORMS:
                raise ValueError(f"must be one of {list(NORMS)}")
        else:
            Recipe(**{gene: value})
    except ValueError as err:
        raise ValueError(f"option 'recipe': {gene} value {value!r}: {err}") from None


def apply_recipe(arch: Architecture, values: Mapping[str, Any]) -> Architecture:
    """``arch`` with the recipe ``values`` (gene -> value; genes not given keep ``arch``'s)."""
    blocks = tuple(_gene_with(g, values) for g in arch.blocks)
    head = arch.head
    if head.widths and ("dropout" in values or "head_norm" in values):  # a head without hidden layers has neither
        head = HeadGene(head.inputs, head.widths, dropout=values.get("dropout", head.dropout),
                        norm=values.get("head_norm", head.norm))
    recipe_genes = {k: v for k, v in values.items() if k in (*DIM_GENES, "embedding_l2", "lr_dense", "lr_sparse")}
    return replace(arch, blocks=blocks, head=head, recipe=replace(arch.recipe, **recipe_genes))


def _gene_with(gene: BlockGene, values: Mapping[str, Any]) -> BlockGene:
    params = dict(gene.params)
    if "dropout" in values and "dropout" in block_params(gene.op):
        params["dropout"] = values["dropout"]
    if "norm" in values and gene.op == "mlp":
        params["norm"] = values["norm"]
    return gene if params == dict(gene.params) else BlockGene(gene.op, gene.inputs, params, gene.tokens)


def strip_recipe(arch: Architecture) -> Architecture:
    """``arch`` with today's values for every recipe gene (what a preset decodes)."""
    return apply_recipe(replace(arch, recipe=Recipe()), {"dropout": 0.0, "norm": MLP_NORM, "head_norm": "none"})


def read_recipe(arch: Architecture, genes: Sequence[str]) -> dict[str, Any] | None:
    """The value of each of ``genes`` in ``arch``; ``None`` when a gene differs between the layers it
    sets (such an architecture is no point of a space whose one choice sets them all)."""
    out: dict[str, Any] = {}
    for gene in genes:
        if gene == "dropout":
            seen = {g.params["dropout"] for g in arch.blocks if "dropout" in g.params}
            seen = (seen | {arch.head.dropout} if arch.head.widths else seen) or {0.0}
        elif gene == "norm":
            seen = {g.params["norm"] for g in arch.blocks if g.op == "mlp"} or {MLP_NORM}
        elif gene == "head_norm":
            seen = {arch.head.norm} if arch.head.widths else {"none"}
        else:
            seen = {getattr(arch.recipe, gene)}
        if len(seen) != 1:
            return None
        out[gene] = seen.pop()
    return out


__all__ = ["PREFIX", "RECIPE_GENES", "apply_recipe", "check_recipe_menus", "default_recipe_menus",
           "read_recipe", "strip_recipe"]
