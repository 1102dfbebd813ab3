"""Recipe and capacity genes: per-field embedding widths, dropout, normalization, embedding L2 and
learning rates. Each round-trips through JSON, builds, is costed exactly, and trains; a genotype
written before these genes existed loads with today's values and keeps its hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.config import TrainConfig
from rankitect.cost import measure
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.builder import build_model
from rankitect.space.recipe import Recipe, vocab_group
from rankitect.space.testing import tiny_batch
from rankitect.train.task import RankingTask

# Written by rankitect at df667f5, before recipe genes existed: six baselines, samples of both
# presets and a ROCS sample, each with the JSON and hash that code gave it.
OLD_GENOTYPES = json.loads((Path(__file__).parent / "old_genotypes.json").read_text())
VOCABS = (5, 150, 12_000, 8, 300, 20_000)  # small, medium, large, small, medium, large


def mixed_spec() -> FeatureSpec:
    """Sparse features of every vocabulary group; the last of each kind request side."""
    sparse = tuple(SparseFeature(f"s{i}", v, side="request" if i == len(VOCABS) - 1 else "candidate")
                   for i, v in enumerate(VOCABS))
    return FeatureSpec(dense=(DenseFeature("d0"), DenseFeature("d1", side="request")), sparse=sparse)


def full_arch(*, rocs: bool = False, recipe: Recipe | None = None) -> Architecture:
    """Every new gene off its default."""
    recipe = recipe or Recipe(dim_small=4, dim_large=12, embedding_l2=1e-3, lr_dense=2.0, lr_sparse=0.5)
    blocks = (
        BlockGene("mlp", ("dense", "sparse"), {"width": 16, "num_layers": 2, "norm": "batchnorm", "dropout": 0.2}),
        BlockGene("attention", ("sparse", 0), {"num_heads": 2, "dropout": 0.1}, tokens=2),
    )
    return Architecture(blocks, HeadGene((1, 0), (8,), dropout=0.3, norm="layernorm"), 8, rocs=rocs, recipe=recipe)


GENE_VARIANTS = {
    "dim_small": Recipe(dim_small=2),
    "dim_medium": Recipe(dim_medium=16),
    "dim_large": Recipe(dim_large=4),
    "embedding_l2": Recipe(embedding_l2=0.01),
    "lr_dense": Recipe(lr_dense=0.5),
    "lr_sparse": Recipe(lr_sparse=2.0),
}


@pytest.mark.parametrize("name", sorted(GENE_VARIANTS))
def test_each_recipe_gene_round_trips_and_enters_the_json(name: str) -> None:
    arch = full_arch(recipe=GENE_VARIANTS[name])
    again = Architecture.from_json(arch.to_json())
    assert again == arch and again.hash == arch.hash
    assert list(json.loads(arch.to_json())["recipe"]) == [name]


@pytest.mark.parametrize(("where", "change"), [
    ("mlp.dropout", lambda g: g.blocks[0].params["dropout"]),
    ("mlp.norm", lambda g: g.blocks[0].params["norm"]),
    ("attention.dropout", lambda g: g.blocks[1].params["dropout"]),
    ("head.dropout", lambda g: g.head.dropout),
    ("head.norm", lambda g: g.head.norm),
])
def test_dropout_and_norm_genes_round_trip(where: str, change) -> None:
    arch = full_arch()
    again = Architecture.from_json(arch.to_json(indent=2))
    assert change(again) == change(arch) and again == arch


def test_an_int_dropout_is_stored_as_a_float() -> None:
    gene = BlockGene("mlp", ("dense",), {"width": 4, "dropout": 0})
    assert type(gene.params["dropout"]) is float and "dropout" not in json.dumps(gene.to_dict())


@pytest.mark.parametrize(("bad", "key"), [
    ({"recipe": {"dim_small": 0}}, "dim_small"), ({"recipe": {"embedding_l2": -1.0}}, "embedding_l2"),
    ({"recipe": {"lr_dense": 0}}, "lr_dense"), ({"recipe": {"warmup": 3}}, "warmup"),
    ({"head": {"inputs": [0], "norm": "groupnorm"}}, "norm"), ({"head": {"inputs": [0], "dropout": 1.0}}, "dropout"),
])
def test_bad_recipe_genes_are_refused_naming_the_key(bad: dict, key: str) -> None:
    d = {"blocks": [{"op": "mlp", "inputs": ["dense"], "params": {"width": 4}}], **bad}
    with pytest.raises(ValueError, match=key):
        Architecture.from_dict(d)


@pytest.mark.parametrize("old", OLD_GENOTYPES, ids=[o["name"] for o in OLD_GENOTYPES])
def test_an_old_genotype_loads_with_todays_values_and_keeps_its_hash(old: dict) -> None:
    arch = Architecture.from_json(old["json"])
    assert arch.recipe == Recipe() and arch.head.dropout == 0.0 and arch.head.norm == "none"
    assert all(g.params.get("dropout", 0.0) == 0.0 for g in arch.blocks)
    assert arch.to_json() == old["json"]
    assert arch.hash == old["hash"] == hashlib.sha256(old["json"].encode()).hexdigest()[:16]


def test_vocabulary_groups() -> None:
    assert [vocab_group(v) for v in (2, 100, 101, 10_000, 10_001)] == ["small", "small", "medium", "medium", "large"]


def counted_flops(model: torch.nn.Module, batch) -> float:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(batch)
    return counter.get_total_flops() / len(batch)


@pytest.mark.parametrize("rocs", [False, True])
def test_flops_with_per_field_widths_and_projections_equal_torchs_count(rocs: bool) -> None:
    spec, arch = mixed_spec(), full_arch(rocs=rocs)
    model = build_model(arch, spec).eval()
    assert sorted(model.embedding.projections) == ["large", "small"]  # medium stays at D: no projection
    # small: 2 fields 4 -> 8, large: 2 fields 12 -> 8
    assert model.embedding.flops() == 2 * 2 * 4 * 8 + 2 * 2 * 12 * 8
    assert measure(arch, spec).flops == counted_flops(model, tiny_batch(spec, 6))


def test_tables_have_their_groups_width_and_fields_reach_d() -> None:
    spec = mixed_spec()
    model = build_model(full_arch(), spec)
    widths = {f.name: model.embedding.table(f.name).shape[1] for f in spec.sparse}
    assert widths == {"s0": 4, "s1": 8, "s2": 12, "s3": 4, "s4": 8, "s5": 12}
    batch = tiny_batch(spec, 3)
    fields = model.embedding(batch.sparse)
    assert tuple(fields.shape) == (3, 6, 8)
    ids = batch.sparse_ids()
    # Field order is request side first: s5, then s0..s4. A field of s2 (large) is its row times the projection.
    k = model.embedding.feature_names.index("s2")
    row = model.embedding.table("s2")[ids[:, 2]]
    assert torch.allclose(fields[:, k], row @ model.embedding.projections["large"].weight.T)
    k = model.embedding.feature_names.index("s1")
    assert torch.equal(fields[:, k], model.embedding.table("s1")[ids[:, 1]])


def test_the_l2_term_is_the_naive_sum_over_the_looked_up_rows() -> None:
    spec = mixed_spec()
    model = build_model(full_arch(), spec)
    batch = tiny_batch(spec, 5)
    _, penalty = model.forward_with_l2(batch)
    ids = batch.sparse_ids()
    naive = 0.0
    for b in range(len(batch)):
        for j, f in enumerate(spec.sparse):
            naive += float((model.embedding.table(f.name)[ids[b, j]].detach() ** 2).sum())
    assert penalty.item() == pytest.approx(naive / len(batch), rel=1e-5)


def test_the_training_loss_adds_the_weighted_l2_term() -> None:
    spec = mixed_spec()
    arch = full_arch()
    model = build_model(arch, spec).eval()  # eval: no dropout, batch norm on running statistics
    batch = tiny_batch(spec, 5)
    task = RankingTask(model, TrainConfig())
    logits, penalty = model.forward_with_l2(batch)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    assert task.loss(batch).item() == pytest.approx(bce.item() + 1e-3 * penalty.item(), rel=1e-6)


def test_optimizers_take_the_genotypes_learning_rates() -> None:
    model = build_model(full_arch(), mixed_spec())
    cfg = TrainConfig(lr_dense=1e-3, lr_sparse=0.05)
    sparse_opt, dense_opt = RankingTask(model, cfg).configure_optimizers()
    assert sparse_opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert dense_opt.param_groups[0]["lr"] == pytest.approx(2e-3)
    # The projections are dense parameters; only the tables go to the row-wise optimizer.
    assert {id(p) for p in sparse_opt.param_groups[0]["params"]} == {id(p) for p in model.sparse_parameters()}
    assert all(p.dim() == 2 and p.shape[0] in VOCABS for p in sparse_opt.param_groups[0]["params"])


def test_dropout_acts_in_training_only_and_eval_equals_the_model_without_it() -> None:
    spec = mixed_spec()
    arch = full_arch()
    plain = Architecture(
        tuple(BlockGene(g.op, g.inputs, {**g.params, "dropout": 0.0}, g.tokens) for g in arch.blocks),
        HeadGene(arch.head.inputs, arch.head.widths, norm=arch.head.norm), 8, recipe=arch.recipe)
    model, reference = build_model(arch, spec), build_model(plain, spec)
    reference.load_state_dict(model.state_dict())
    batch = tiny_batch(spec, 6)
    model.eval(), reference.eval()
    assert torch.equal(model(batch), reference(batch))
    model.train(), reference.train()
    torch.manual_seed(0)
    assert not torch.allclose(model(batch), reference(batch))


def test_rocs_scoring_with_every_new_gene_equals_the_plain_forward() -> None:
    from rankitect.serve.rocs import score_requests

    spec = mixed_spec()
    model = build_model(full_arch(rocs=True), spec)
    with torch.no_grad():  # running statistics away from 0/1, so batch norm is not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
    model.eval()
    batch = tiny_batch(spec, 8)
    assert torch.allclose(score_requests(model, batch), model(batch), atol=1e-5)


def test_a_model_with_every_new_gene_trains(tmp_path: Path) -> None:
    from rankitect.train.loop import train_architecture
    from tests.search.tiny_data import tiny_click_data

    spec = mixed_spec()
    data = tiny_click_data(tmp_path / "data", rows=512, spec=spec)
    result = train_architecture(full_arch(), data, TrainConfig(max_epochs=1, steps=4, batch_size=64, progress=False))
    assert result.steps == 4 and 0 < result.metrics["val/ne"] < 10
    bn = result.model.blocks[0].layers[1]
    assert isinstance(bn, torch.nn.BatchNorm1d) and int(bn.num_batches_tracked) == 4
