"""The sparse input stem: one torchrec embedding table per sparse feature, in field order.

Sparse ids enter every model through a torchrec ``EmbeddingBagCollection`` so that sharding the
tables later (``DistributedModelParallel``) needs no rewrite. Each row has exactly one id per
feature, so sum pooling returns that id's embedding unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rankitect.data.spec import FeatureSpec


class SparseEmbedding(nn.Module):
    """Embeds a batch's sparse ids into a field tensor ``(B, n_sparse, dim)`` in field order.

    Field order is the spec's :meth:`~rankitect.data.spec.FeatureSpec.sparse_in_field_order`
    (request-side features first), whatever the key order of the incoming ``KeyedJaggedTensor``.

    Args:
        spec: the feature spec; one table ``t_<feature>`` of ``vocab_size`` rows per sparse feature.
        dim: the embedding dimension ``D``.
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

    def __init__(self, spec: FeatureSpec, dim: int, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"embedding dim must be an int >= 1, got {dim!r}")
        if spec.n_sparse == 0:
            raise ValueError("SparseEmbedding needs at least one sparse feature; the spec has none")
        self.dim = dim
        self.feature_names = [f.name for f in spec.sparse_in_field_order()]
        tables = [
            EmbeddingBagConfig(
                name=f"t_{f.name}", embedding_dim=dim, num_embeddings=f.vocab_size, feature_names=[f.name]
            )
            for f in spec.sparse_in_field_order()
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

    def forward(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled_kt = self.ebc(sparse)
        # KeyedTensor values follow the table order given above (field order): (B, n_sparse * D)
        pooled = pooled_kt.values()
        if pooled_kt.keys() != self.feature_names:
            # A sharded collection (DistributedModelParallel) groups its outputs by shard.
            by_key = pooled_kt.to_dict()  # name -> (B, D)
            pooled = torch.cat([by_key[name] for name in self.feature_names], dim=1)
        B = pooled.shape[0]
        return pooled.view(B, len(self.feature_names), self.dim)  # (B, n_sparse*D) -> (B, n_sparse, D)
