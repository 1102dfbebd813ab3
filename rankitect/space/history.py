"""The history stem: a batch's sequence features as the :class:`~rankitect.blocks.sequence.History`
inputs of history blocks.

A history ``"history:<name>"`` becomes ``seq`` ``(B, L, D)`` (its ids, right-aligned, looked up),
``mask`` ``(B, L)`` and ``target`` ``(B, D)``. A history that ``shares`` a sparse feature looks its
ids up in that feature's table (brought to ``D`` by its vocabulary group's projection, as the
field is): the same item has one embedding in the candidate field and in the history, and the
``target`` is that candidate field. A history without ``shares`` has a table of its own
(``tables.<name>``, a sparse parameter) and no target; a block that reads the candidate item
(``uses_target``) cannot read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankitect.blocks.base import get_block_class
from rankitect.blocks.sequence import History
from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec, SequenceFeature
from rankitect.space.architecture import Architecture, history_name, history_ref
from rankitect.space.embedding import SparseEmbedding


class HistoryInputs(nn.Module):
    """The histories an architecture reads, looked up (see the module docstring).

    The shared tables stay the model's :class:`~rankitect.space.embedding.SparseEmbedding`'s; the
    methods that read them take it as ``embedding``.

    Args:
        arch: the architecture (its genes name the histories they read).
        spec: the feature spec (each history's ``max_len``, vocabulary and shared feature).
        dim: the embedding dimension ``D``.
    """

    def __init__(self, arch: Architecture, spec: FeatureSpec, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.features = [spec.sequence_feature(name) for name in arch.histories()]
        self.tables = nn.ModuleDict({f.name: nn.Embedding(f.vocab_size, dim, sparse=True)
                                     for f in self.features if f.shares is None})
        for i, gene in enumerate(arch.blocks):
            name = history_name(gene.inputs[0]) if gene.inputs else None
            if name is not None and get_block_class(gene.op).uses_target and spec.sequence_feature(name).shares is None:
                raise ValueError(f"blocks[{i}] ({gene.op}) reads the candidate item, but history {name!r} shares no "
                                 "sparse feature (name one with 'shares')")

    def embed(self, name: str, ids: torch.Tensor, embedding: SparseEmbedding | None) -> torch.Tensor:
        """Ids ``(R, L)`` of history ``name`` as embeddings ``(R, L, D)``."""
        f = self.feature(name)
        if f.shares is None:
            return F.embedding(ids, self.tables[name].weight, sparse=True)  # (R, L, D)
        if embedding is None:
            raise ValueError(f"history {name!r} shares {f.shares!r}, but the model has no sparse embedding")
        # (R, L, d): sparse gradients, as the table's own
        rows = F.embedding(ids, embedding.table(f.shares), sparse=True)
        return embedding.project(f.shares, rows)  # (R, L, d) -> (R, L, D) when the table is not D wide

    def feature(self, name: str) -> SequenceFeature:
        return next(f for f in self.features if f.name == name)

    def target(self, name: str, embedding: SparseEmbedding | None, emb: torch.Tensor | None, rows: int,
               like: torch.Tensor) -> torch.Tensor:
        """The candidate item ``(rows, D)`` history ``name`` is read for: the field it shares in ``emb``
        ``(rows, n_sparse, D)`` (zeros without one: no block that reads it is built then)."""
        f = self.feature(name)
        if f.shares is None or embedding is None or emb is None:
            return like.new_zeros(rows, self.dim)
        return emb[:, embedding.feature_names.index(f.shares)]

    def forward(self, batch: Batch, embedding: SparseEmbedding | None, emb: torch.Tensor | None) -> dict[str, History]:
        """Each history read, by its input reference: ``"history:<name>" -> History``; ``emb`` are the
        batch's sparse fields ``(B, n_sparse, D)`` (the targets), or ``None`` when no history shares."""
        out = {}
        for f in self.features:
            ids, mask = batch.history_padded(f.name, f.max_len)  # (B, L) each
            seq = self.embed(f.name, ids, embedding)
            out[history_ref(f.name)] = History(seq, mask, self.target(f.name, embedding, emb, ids.shape[0], seq))
        return out

    def flops(self, embedding: SparseEmbedding | None) -> int:
        """FLOPs per example of bringing shared rows narrower than ``D`` to ``D`` (lookups are free)."""
        total = 0
        for f in self.features:
            if f.shares is None or embedding is None:
                continue
            width = embedding.dims[embedding.feature_names.index(f.shares)]
            if width != self.dim:
                total += 2 * f.max_len * width * self.dim
        return total

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The own tables (the shared ones are the sparse embedding's)."""
        return list(self.tables.parameters())


def shares_a_table(arch: Architecture, spec: FeatureSpec) -> bool:
    """Whether a history ``arch`` reads looks its ids up in a sparse feature's table."""
    return any(spec.sequence_feature(name).shares is not None for name in arch.histories())


__all__ = ["HistoryInputs", "shares_a_table"]
