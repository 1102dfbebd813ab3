"""The builder: input adapters against hand-written references, ROCS masking, parameter groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.data.batch import Batch, make_batch
from rankitect.data.spec import FeatureSpec
from rankitect.blocks.common import MaskedLinear
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.builder import build_model
from rankitect.space.testing import tiny_batch, tiny_spec


def naive_embeddings(model: torch.nn.Module, spec: FeatureSpec, batch: Batch) -> torch.Tensor:
    ids, names = batch.sparse_ids(), spec.sparse_names
    fields = [model.embedding.table(f.name)[ids[:, names.index(f.name)]] for f in spec.sparse_in_field_order()]
    return torch.stack(fields, dim=1)  # (B, n_sparse, D)


def test_flat_adapter_flattens_then_concatenates(spec: FeatureSpec, batch: Batch) -> None:
    arch = Architecture((BlockGene("mlp", ("sparse", "dense"), {"width": 5}),), HeadGene((0, "dense"), ()), 3)
    model = build_model(arch, spec)
    emb = naive_embeddings(model, spec, batch)
    x = torch.cat([emb.reshape(4, -1), batch.dense], dim=1)  # (B, 6*3 + 4)
    expected = model.head.mlp(torch.cat([model.blocks[0](x), batch.dense], dim=1)).squeeze(-1)
    torch.testing.assert_close(model(batch), expected)


def test_field_adapter_appends_projected_tokens(spec: FeatureSpec, batch: Batch) -> None:
    arch = Architecture(
        (BlockGene("mlp", ("dense",), {"width": 5}), BlockGene("dot", ("dense", "sparse", 0), tokens=2)),
        HeadGene((1,), ()),
        3,
    )
    model = build_model(arch, spec)
    emb = naive_embeddings(model, spec, batch)
    h = model.blocks[0](batch.dense)
    proj = model.adapters[1].proj
    tokens = (torch.cat([batch.dense, h], dim=1) @ proj.weight.T + proj.bias).view(4, 2, 3)
    fields = torch.cat([emb, tokens], dim=1)  # (B, 6 + 2, 3): field inputs first, then the tokens
    gram = fields @ fields.transpose(1, 2)
    pairs = torch.stack([gram[:, i, j] for i in range(8) for j in range(i + 1, 8)], dim=1)
    assert model.blocks[1].out_shape == (28,)
    expected = model.head.mlp(pairs).squeeze(-1)
    torch.testing.assert_close(model(batch), expected)


def test_two_input_block_gets_first_and_rest(spec: FeatureSpec, batch: Batch) -> None:
    genes = (
        BlockGene("mlp", ("dense",), {"width": 5}),
        BlockGene("gating", (0, "sparse", "dense"), {"width": 6}),
        BlockGene("sum", (1,), {"width": 2}),
    )
    model = build_model(Architecture(genes, HeadGene((2,), ()), 3), spec)
    emb = naive_embeddings(model, spec, batch)
    h = model.blocks[0](batch.dense)
    g = model.blocks[1](h, torch.cat([emb.reshape(4, -1), batch.dense], dim=1))
    expected = model.head.mlp(model.blocks[2](g, g)).squeeze(-1)  # one input: left = right
    torch.testing.assert_close(model(batch), expected)


def test_parameter_groups_partition_the_model(spec: FeatureSpec) -> None:
    arch = Architecture((BlockGene("dot", ("sparse", "dense")),), embedding_dim=3)
    model = build_model(arch, spec)
    sparse, dense = list(model.sparse_parameters()), list(model.dense_parameters())
    assert {id(p) for p in sparse} | {id(p) for p in dense} == {id(p) for p in model.parameters()}
    assert not {id(p) for p in sparse} & {id(p) for p in dense}
    assert sum(p.numel() for p in sparse) == sum(f.vocab_size for f in spec.sparse) * 3


def test_no_embedding_when_sparse_is_unused(spec: FeatureSpec, batch: Batch) -> None:
    model = build_model(Architecture((BlockGene("mlp", ("dense",), {"width": 4}),), embedding_dim=3), spec)
    assert model.embedding is None and list(model.sparse_parameters()) == []
    assert model(batch).shape == (4,)


def test_dense_input_without_dense_features_is_an_error() -> None:
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 4}),), embedding_dim=3)
    with pytest.raises(ValueError, match="dense"):
        build_model(arch, tiny_spec(n_dense=0))


def test_impossible_shape_names_the_gene(spec: FeatureSpec) -> None:
    arch = Architecture((BlockGene("dcn", ("dense",), {"low_rank": 9}),), embedding_dim=3)
    with pytest.raises(ValueError, match=r"blocks\[0\]"):
        build_model(arch, spec)


ROCS_GENES = (
    BlockGene("mlp", ("dense",), {"width": 6}),
    BlockGene("attention", ("sparse", 0), {"num_heads": 1}, tokens=3),
    BlockGene("efc", (1, "sparse"), {"out_fields": 5}),
    BlockGene("dot", (2,)),
    BlockGene("gating", (0, 3, "dense"), {"width": 6}),
    BlockGene("fm", (2, 1)),
    BlockGene("dcn", (4, 5), {"low_rank": 3}),
    BlockGene("wukong", (2,), {"fmb_fields": 2, "lcb_fields": 2, "low_rank": 2, "mlp_width": 4}),
    BlockGene("sum", (6, 7), {"width": 8}),
)


def _hooked(model: torch.nn.Module, modules: list[torch.nn.Module], batch: Batch) -> list[torch.Tensor]:
    """The outputs of ``modules`` in one forward pass of ``model``."""
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o)) for b in modules]
    model(batch)
    for h in hooks:
        h.remove()
    return outs


def _outputs(model: torch.nn.Module, batch: Batch) -> list[torch.Tensor]:
    return _hooked(model, list(model.blocks), batch)


@pytest.mark.parametrize("share", [None, 0.75])
def test_rocs_request_outputs_ignore_candidate_features(spec: FeatureSpec, share: float | None) -> None:
    arch = Architecture(ROCS_GENES, HeadGene((8, 7, "dense"), (6, 4)), 3, rocs=True, rocs_share=share)
    torch.manual_seed(0)
    model = build_model(arch, spec)
    base = tiny_batch(spec, 4, seed=1)
    dense, ids = base.dense.clone(), base.sparse_ids().clone()
    cand_dense = [j for j, f in enumerate(spec.dense) if f.side == "candidate"]
    cand_sparse = [j for j, f in enumerate(spec.sparse) if f.side == "candidate"]
    dense[:, cand_dense] += 1.0
    ids[:, cand_sparse] = (ids[:, cand_sparse] + 1) % 5  # vocabularies are >= 5
    moved = make_batch(dense, ids, base.labels, base.request_ids, keys=spec.sparse_names)
    with torch.no_grad():
        before, after = _outputs(model, base), _outputs(model, moved)
        # The head's hidden layers (before their ReLU) are masked too: (B, width) each.
        hidden = [m for m in model.head.mlp[:-1] if isinstance(m, MaskedLinear)]
        head_before, head_after = _hooked(model, hidden, base), _hooked(model, hidden, moved)
    for lin, x, y in zip(hidden, head_before, head_after, strict=True):
        r = lin.request_out
        assert 0 < r < lin.out_features
        if share is not None:
            assert r == round(share * lin.out_features)
        torch.testing.assert_close(x[:, :r], y[:, :r], rtol=0, atol=0, msg="head request units moved")
        assert not torch.allclose(x[:, r:], y[:, r:])
    request = [b.request_out for b in model.blocks]
    assert sum(r > 0 for r in request) >= len(request) - 1, request  # dot of one request field has no pair
    for i, (x, y, r) in enumerate(zip(before, after, request)):
        torch.testing.assert_close(x[:, :r], y[:, :r], msg=f"blocks[{i}] request part moved")
        assert not torch.allclose(x, y), f"blocks[{i}] ignores candidate features entirely"


def test_rocs_changes_no_shapes_or_flops_except_fm_split(spec: FeatureSpec) -> None:
    genes = ROCS_GENES[:5]
    plain = build_model(Architecture(genes, HeadGene((4,), ()), 3), spec)
    masked = build_model(Architecture(genes, HeadGene((4,), ()), 3, rocs=True), spec)
    assert [b.out_shape for b in plain.blocks] == [b.out_shape for b in masked.blocks]
    assert plain.flops() == masked.flops()
    assert np.isclose(sum(p.numel() for p in plain.parameters()), sum(p.numel() for p in masked.parameters()))


@pytest.mark.parametrize("rocs", [False, True])
def test_dense_features_are_standardized_with_the_spec_statistics(spec: FeatureSpec, batch: Batch, rocs: bool) -> None:
    """A model of a spec with training statistics equals, weight for weight, the model of the same
    spec without them fed ``(x - mean) / std`` by hand."""
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 8}), BlockGene("dot", ("sparse", 0))),
                        HeadGene((1, 0), (16,)), embedding_dim=4, rocs=rocs)
    mean, std = np.array([12.0, -3.0, 0.5, 100.0]), np.array([0.6, 2.0, 1.0, 40.0])
    stats = spec.with_dense_stats(mean, std)
    plain, standardized = build_model(arch, spec), build_model(arch, stats)
    standardized.load_state_dict(plain.state_dict())  # the statistics are no trained weights
    assert plain.state_dict().keys() == standardized.state_dict().keys()
    by_hand = make_batch(((batch.dense.double() - torch.tensor(mean)) / torch.tensor(std)).float(),
                         batch.sparse_ids(), batch.labels, batch.request_ids, keys=list(batch.sparse.keys()))
    with torch.no_grad():
        torch.testing.assert_close(standardized(batch), plain(by_hand), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(standardized(batch), plain(batch), atol=1e-3)
