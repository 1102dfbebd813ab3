"""SparseEmbedding: field order (request side first) against a naive per-feature lookup."""

from __future__ import annotations

import torch

from rankitect.space.embedding import SparseEmbedding
from rankitect.data.spec import FeatureSpec, SparseFeature
from rankitect.space.testing import tiny_batch


def test_field_order_matches_naive_lookup() -> None:
    spec = FeatureSpec(
        dense=(),
        sparse=(SparseFeature("a", 7), SparseFeature("u", 5, side="request"), SparseFeature("b", 9),
                SparseFeature("v", 4, side="request")),
    )
    batch = tiny_batch(spec, 6)
    emb = SparseEmbedding(spec, 3)
    out = emb(batch.sparse)
    ids = batch.sparse_ids()  # (B, n_sparse) in spec (storage) order
    storage = [f.name for f in spec.sparse]
    expected = torch.stack(
        [emb.table(name)[ids[:, storage.index(name)]] for name in ["u", "v", "a", "b"]], dim=1
    )
    assert emb.feature_names == ["u", "v", "a", "b"]
    assert out.shape == (6, 4, 3)
    assert torch.equal(out, expected)


def test_meta_device_allocates_nothing_and_counts_rows() -> None:
    spec = FeatureSpec(dense=(), sparse=(SparseFeature("a", 7), SparseFeature("b", 11)))
    emb = SparseEmbedding(spec, 5, device="meta")
    params = list(emb.parameters())
    assert all(p.device.type == "meta" for p in params)
    assert sum(p.numel() for p in params) == (7 + 11) * 5


def test_gradients_reach_only_looked_up_rows() -> None:
    spec = FeatureSpec(dense=(), sparse=(SparseFeature("a", 7),))
    batch = tiny_batch(spec, 4)
    emb = SparseEmbedding(spec, 2)
    emb(batch.sparse).sum().backward()
    grad = emb.table("a").grad
    assert grad is not None
    used = set(batch.sparse_ids()[:, 0].tolist())
    for row in range(7):
        assert bool(grad[row].abs().sum() > 0) == (row in used)
