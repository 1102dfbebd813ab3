"""The sparse input stem: one torchrec embedding table per sparse feature, in field order.

Sparse ids enter every model through a torchrec ``EmbeddingBagCollection`` so that sharding the
tables later (``DistributedModelParallel``) needs no rewrite. Each row has exactly one id per
feature, so sum pooling returns that id's embedding unchanged.

Tables may be narrower or wider than the model's embedding dimension ``D`` (the recipe's width
per vocabulary group, :mod:`rankitect.space.recipe`): the fields of such a group are projected to
``D`` by one bias-free Linear of that group, ``(B, n_g, d_g) -> (B, n_g, D)``, so every block
still reads fields of width ``D``. A projection costs ``2 * n_g * d_g * D`` FLOPs per example.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rankitect.data.spec import FeatureSpec
from rankitect.space.recipe import Recipe, vocab_group


class SparseEmbedding(nn.Module):
    """Embeds a batch's sparse ids into a field tensor ``(B, n_sparse, dim)`` in field order.

    Field order is the spec's :meth:`~rankitect.data.spec.FeatureSpec.sparse_in_field_order`
    (request-side features first), whatever the key order of the incoming ``KeyedJaggedTensor``.

    Args:
        spec: the feature spec; one table ``t_<feature>`` of ``vocab_size`` rows per sparse feature.
        dim: the embedding dimension ``D``.
        recipe: the table width of each vocabulary group (default: ``D`` for every table).
        device: where the tables live (``"meta"`` to size a model without allocating it).

    >>> import numpy as np
    >>> from rankitect.data.batch import make_batch
    >>> from rankitect.data.spec import SparseFeature
    >>> spec = FeatureSpec(dense=(), sparse=(SparseFeature("s0", 10), SparseFeature("u0", 5, side="request")))
    >>> emb = SparseEmbedding(spec, 4)
    >>> batch = make_batch(np.zeros((3, 0)), np.array([[1, 2], [3, 4], [5, 0]]), np.zeros(3),
    ...                    np.zeros(3), keys=spec.sparse_names)
    >>> out = emb(batch.sparse)
    >>> tuple(out.shape), emb.feature_names
    ((3, 2, 4), ['u0', 's0'])
    >>> torch.equal(out[:, 0], emb.table("u0")[batch.sparse_ids()[:, 1]])
    True
    """

    def __init__(self, spec: FeatureSpec, dim: int, *, recipe: Recipe | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"embedding dim must be an int >= 1, got {dim!r}")
        if spec.n_sparse == 0:
            raise ValueError("SparseEmbedding needs at least one sparse feature; the spec has none")
        recipe = recipe or Recipe()
        self.dim = dim
        features = spec.sparse_in_field_order()
        self.feature_names = [f.name for f in features]
        self.dims = [recipe.field_dim(f.vocab_size, dim) for f in features]  # table width per field
        groups = [vocab_group(f.vocab_size) for f in features]
        # One projection per group whose width is not D; its fields' positions in field order.
        self.projected = {g: [k for k, h in enumerate(groups) if h == g]
                          for g in dict.fromkeys(groups) if recipe.group_dim(g, dim) != dim}
        self.projections = nn.ModuleDict({
            g: nn.Linear(recipe.group_dim(g, dim), dim, bias=False, device=device) for g in self.projected
        })
        tables = [
            EmbeddingBagConfig(
                name=f"t_{f.name}", embedding_dim=d, num_embeddings=f.vocab_size, feature_names=[f.name]
            )
            for f, d in zip(features, self.dims)
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device or torch.get_default_device()))
        for bag in self.ebc.embedding_bags.values():
            # Sparse gradients: a step touches only the rows a batch looked up, not every row of
            # every table (rankitect.train.optim.RowWiseAdagrad updates just those rows).
            bag.sparse = True

    @property
    def out_shape(self) -> tuple[int, int]:
        return (len(self.feature_names), self.dim)

    def table(self, feature: str) -> torch.Tensor:
        """The ``(vocab_size, dim)`` weight of one feature's table."""
        return self.ebc.embedding_bags[f"t_{feature}"].weight

    def lookup(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """The looked-up rows side by side in field order: ``(B, sum of table widths)``."""
        pooled_kt = self.ebc(sparse)
        # KeyedTensor values follow the table order given above (field order): (B, sum_f d_f)
        pooled = pooled_kt.values()
        if pooled_kt.keys() != self.feature_names:
            # A sharded collection (DistributedModelParallel) groups its outputs by shard.
            by_key = pooled_kt.to_dict()  # name -> (B, d_f)
            pooled = torch.cat([by_key[name] for name in self.feature_names], dim=1)
        return pooled

    def to_fields(self, rows: torch.Tensor) -> torch.Tensor:
        """Looked-up rows ``(B, sum_f d_f)`` as fields of width ``D``: ``(B, n_sparse, D)``."""
        B = rows.shape[0]
        if not self.projected:
            return rows.view(B, len(self.feature_names), self.dim)  # (B, n_sparse*D) -> (B, n_sparse, D)
        parts = list(rows.split(self.dims, dim=1))  # n_sparse x (B, d_f)
        for group, fields in self.projected.items():
            stacked = torch.stack([parts[k] for k in fields], dim=1)  # (B, n_g, d_g)
            out = self.projections[group](stacked)  # (B, n_g, d_g) @ (d_g, D) -> (B, n_g, D)
            for j, k in enumerate(fields):
                parts[k] = out[:, j]
        return torch.stack(parts, dim=1)  # n_sparse x (B, D) -> (B, n_sparse, D)

    def forward(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.to_fields(self.lookup(sparse))

    def project(self, feature: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``(B, d_f)`` of one feature's table brought to width ``D`` (its group's projection)."""
        k = self.feature_names.index(feature)
        for group, fields in self.projected.items():
            if k in fields:
                return self.projections[group](rows)  # (B, d_g) @ (d_g, D) -> (B, D)
        return rows

    def flops(self) -> int:
        """Forward FLOPs per example of the projections (lookups are free)."""
        return sum(2 * len(fields) * self.projections[g].in_features * self.dim for g, fields in self.projected.items())

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The tables (for the row-wise optimizer); the projections are dense parameters."""
        return list(self.ebc.parameters())
