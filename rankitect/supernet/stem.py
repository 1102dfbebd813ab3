"""The supernet's embedding stem under the recipe's table widths (:mod:`rankitect.space.recipe`).

Every table is as wide as the widest table-width option of the space (at least ``D``), and each
vocabulary group with an option other than ``D`` has one bias-free projection ``(W -> D)``. A path
whose group is ``d`` wide reads each of its tables' first ``d`` columns and, when ``d`` is not
``D``, the projection's first ``d`` columns: what a standalone
:class:`~rankitect.space.embedding.SparseEmbedding` of that width computes with the cut weights.
The tables and projections stay the :class:`~rankitect.supernet.model.Supernet`'s own modules
(``embedding``, ``projections``): these functions read them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rankitect.blocks.sequence import History
from rankitect.data.spec import SequenceFeature
from rankitect.space.architecture import history_ref
from rankitect.space.builder import RankingModel
from rankitect.space.embedding import SparseEmbedding
from rankitect.space.recipe import Recipe
from rankitect.space.recipe_space import PREFIX
from rankitect.space.space import SearchSpace
from rankitect.supernet.cut import Params, Take, pick


def table_widths(space: SearchSpace, dim: int) -> tuple[int, set[str]]:
    """The widest table-width option of ``space`` (at least ``dim``) and the vocabulary groups with an
    option that is not ``dim`` (they need a projection)."""
    widest, projected = dim, set()
    for label, choice in space.choices.items():
        if label.startswith(PREFIX + "dim_"):
            widths = [o for o in choice.options if o is not None and o != dim]
            widest = max([widest, *widths])
            if widths:
                projected.add(label[len(PREFIX + "dim_"):])
    return widest, projected


def has_head_norms(space: SearchSpace) -> bool:
    """Whether a path of ``space`` may normalize its head's hidden layers."""
    choice = space.choices.get(PREFIX + "head_norm")
    return choice is not None and any(o != "none" for o in choice.options)


def recipe_gates(space: SearchSpace, groups: list[str]) -> tuple[str, ...]:
    """The recipe labels that change a path's forward (widths, dropout, norms): they decide the whole
    network, so their gates scale the logits, as the head's labels' do. A width label of a
    vocabulary group without fields changes nothing and gets no gate."""
    deciding = ("dropout", "norm", "head_norm", *(f"dim_{g}" for g in dict.fromkeys(groups)))
    return tuple(label for label in space.choices if label.startswith(PREFIX) and label[len(PREFIX):] in deciding)


def path_fields(embedding: SparseEmbedding, projections: nn.ModuleDict, groups: list[str], dim: int,
                sparse: KeyedJaggedTensor, recipe: Recipe, take: Take = pick) -> torch.Tensor:
    """The sparse fields ``(B, n_sparse, D)`` of a path with ``recipe``'s table widths (``groups``:
    each field's vocabulary group, in field order)."""
    rows = embedding.lookup(sparse)  # (B, n_sparse * W)
    B, W, D = rows.shape[0], embedding.dim, dim
    rows = rows.view(B, len(groups), W)  # (B, n_sparse, W)
    dims = [recipe.group_dim(g, D) for g in groups]
    if W == D and all(d == D for d in dims):
        return rows
    parts = [rows[:, k, :d] for k, d in enumerate(dims)]  # n_sparse x (B, d_k)
    for group in dict.fromkeys(groups):
        d = recipe.group_dim(group, D)
        if d == D:
            continue
        if group not in projections or d > W:
            raise ValueError(f"supernet: table width {d} of the {group} vocabulary group is not in the space")
        fields = [k for k, g in enumerate(groups) if g == group]
        stacked = torch.stack([parts[k] for k in fields], dim=1)  # (B, n_g, d)
        out = F.linear(stacked, take(projections[group].weight, None, d))  # (B, n_g, d) -> (B, n_g, D)
        for j, k in enumerate(fields):
            parts[k] = out[:, j]
    return torch.stack(parts, dim=1)  # n_sparse x (B, D) -> (B, n_sparse, D)


def path_histories(embedding: SparseEmbedding, projections: nn.ModuleDict, groups: list[str], dim: int,
                   batch: Any, recipe: Recipe, features: list[SequenceFeature], fields: torch.Tensor | None,
                   own: nn.ModuleDict, take: Take = pick) -> dict[str, History]:
    """The histories ``features`` of a path with ``recipe``'s table widths: a shared history's rows
    are its table's first columns (projected to ``D`` as its field's are), its target the field in
    ``fields`` ``(B, n_sparse, D)``; an own history reads its table in ``own``."""
    out = {}
    for f in features:
        ids, mask = batch.history_padded(f.name, f.max_len)  # (B, L) each
        if f.shares is None:
            seq = F.embedding(ids, own[f.name].weight, sparse=True)  # (B, L, D)
            target = seq.new_zeros(ids.shape[0], dim)
        else:
            k = embedding.feature_names.index(f.shares)
            d = recipe.group_dim(groups[k], dim)
            seq = F.embedding(ids, embedding.table(f.shares), sparse=True)[..., :d]  # (B, L, W) -> (B, L, d)
            if d != dim:
                seq = F.linear(seq, take(projections[groups[k]].weight, None, d))  # (B, L, d) -> (B, L, D)
            target = fields[:, k] if fields is not None else seq.new_zeros(ids.shape[0], dim)
        out[history_ref(f.name)] = History(seq, mask, target)
    return out


def history_flops(recipe: Recipe, groups: list[str], dim: int, features: list[SequenceFeature],
                  names: list[str]) -> int:
    """Forward FLOPs per example of projecting shared history rows narrower than ``dim`` (``names``:
    the sparse features in field order)."""
    total = 0
    for f in features:
        if f.shares is not None and recipe.group_dim(groups[names.index(f.shares)], dim) != dim:
            total += 2 * f.max_len * recipe.group_dim(groups[names.index(f.shares)], dim) * dim
    return total


def stem_flops(recipe: Recipe, groups: list[str], dim: int) -> int:
    """Forward FLOPs per example of the projections of the tables that are not ``dim`` wide."""
    return sum(2 * recipe.group_dim(g, dim) * dim for g in groups if recipe.group_dim(g, dim) != dim)


def stem_state(model: RankingModel, embedding: SparseEmbedding, projections: nn.ModuleDict) -> Params:
    """The weights of ``model``'s embedding (its tables' widths, its projections) cut from the stem."""
    state: Params = {}
    if model.embedding is None:
        return state
    for name, d in zip(model.embedding.feature_names, model.embedding.dims):
        state[f"embedding.ebc.embedding_bags.t_{name}.weight"] = embedding.table(name)[:, :d]
    for group, proj in model.embedding.projections.items():
        state[f"embedding.projections.{group}.weight"] = projections[group].weight[:, :proj.in_features]
    return state


def history_state(model: RankingModel, own: nn.ModuleDict) -> Params:
    """The own history tables of ``model`` (shared ones are the embedding's, in :func:`stem_state`)."""
    if model.history is None:
        return {}
    return {f"history.tables.{name}.weight": own[name].weight for name in model.history.tables}


__all__ = ["has_head_norms", "history_flops", "history_state", "path_fields", "path_histories", "recipe_gates",
           "stem_flops", "stem_state", "table_widths"]
