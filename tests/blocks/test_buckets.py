"""The ``buckets`` block against numpy's quantiles and a naive loop; its edges as data-dependent init."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch

from rankitect.blocks.buckets import Buckets, bucket_edges
from rankitect.config import TrainConfig
from rankitect.space.architecture import BlockGene
from rankitect.space.builder import build_model
from rankitect.space.space import get_space
from rankitect.supernet.train import SupernetTrainer, build_supernet, set_bucket_edges
from rankitect.train.loop import train_model
from rankitect.train.task import TrialDiverged
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_ENGINEER


def test_edges_are_numpy_quantiles_and_a_mostly_zero_count_keeps_zero_apart() -> None:
    gen = np.random.default_rng(0)
    smooth = gen.normal(size=400)
    counts = np.where(gen.random(400) < 0.8, 0.0, gen.exponential(5.0, size=400))  # 80% zeros
    edges = bucket_edges(torch.tensor(np.stack([smooth, counts], 1), dtype=torch.float32), 8).numpy()
    np.testing.assert_allclose(edges[0], np.quantile(smooth.astype(np.float32), np.arange(1, 8) / 8), rtol=1e-5)
    above = counts[counts > 0].astype(np.float32)
    expected = [above.min() / 2, *np.quantile(above, np.arange(1, 7) / 7)]
    np.testing.assert_allclose(edges[1], expected, rtol=1e-5)
    # zero is a bucket of its own; the nonzero counts spread over the other 7 about evenly
    ids = np.searchsorted(edges[1], counts, side="right")
    assert set(ids[counts == 0]) == {0}
    assert np.bincount(ids[counts > 0], minlength=8)[1:].min() >= 0.5 * (counts > 0).sum() / 7


def test_forward_is_the_table_row_of_each_values_bucket() -> None:
    torch.manual_seed(0)
    block = Buckets(3, dim=4, bins=5)
    first = torch.randn(50, 3)
    block.train()
    block(first)  # sets the edges
    x = torch.randn(7, 3) * 2
    out = block.eval()(x)
    weight, edges = block.table.weight, block.edges
    for b in range(7):
        for j in range(3):
            bucket = sum(1 for e in edges[j].tolist() if e <= x[b, j].item())  # naive: edges at or below
            assert torch.equal(out[b, j], weight[j * 5 + bucket])


def test_edges_are_set_by_the_first_training_batch_only_and_travel_in_the_state_dict() -> None:
    torch.manual_seed(1)
    block = Buckets(2, dim=3, bins=4)
    probe = torch.tensor([[-1.0, 2.0], [0.5, -3.0]])
    before = block.eval()(probe)
    assert torch.equal(before[0, 0], block.table.weight[0]) and torch.equal(before[0, 1], block.table.weight[7])
    assert not bool(block.ready)  # eval does not set the edges
    block.train()
    data = torch.randn(100, 2)
    block(data)
    edges = block.edges.clone()
    torch.testing.assert_close(edges, bucket_edges(data, 4))
    block(torch.randn(100, 2) + 10)  # later batches leave them
    assert torch.equal(block.edges, edges)
    fresh = Buckets(2, dim=3, bins=4)
    fresh.load_state_dict(block.state_dict())
    assert bool(fresh.ready) and torch.equal(fresh.eval()(probe), block.eval()(probe))


def test_bad_bins_are_refused() -> None:
    with pytest.raises(ValueError, match="bins"):
        Buckets(2, dim=3, bins=1)


def test_engineer_space_puts_bucket_fields_in_the_stream_and_leaves_an_unread_bottom_out() -> None:
    space = get_space("engineer", max_depth=2)
    sample = space.encode(space.decode(space.sample(np.random.default_rng(0))))
    assert sample is not None
    sample.update({"depth": 1, "L0.op": "attention", "dense.path": "fields", "dense.fields": "buckets",
                   "bottom.layers": 2, "deep.layers": 0, "cross.layers": 0})
    arch = space.decode(sample)
    assert arch.blocks[0] == BlockGene("buckets", ("dense",), {"dim": space.embedding_dim})
    assert arch.blocks[1].op == "attention" and arch.blocks[1].inputs == ("sparse", 0)
    assert not any(g.op == "mlp" and g.inputs == ("dense",) for g in arch.blocks)  # nothing reads a bottom MLP
    assert space.decode(space.encode(arch)) == arch
    both = space.decode({**sample, "dense.path": "both"})  # the top reads the bottom MLP: it stays
    assert both.blocks[0].op == "mlp" and both.blocks[1].op == "buckets" and 0 in both.head.inputs
    assert space.decode(space.encode(both)) == both
    tokens = space.decode({**sample, "dense.fields": "tokens"})
    assert not any(g.op == "buckets" for g in tokens.blocks)


def test_a_supernet_path_with_buckets_sets_the_shared_edges_and_steps_the_table_with_adagrad(
    tmp_path: Path,
) -> None:
    data = tiny_click_data(tmp_path / "data", rows=256)
    space = get_space("engineer", **SMALL_ENGINEER)
    supernet = build_supernet(space, data.spec, 0)
    shared = supernet.ops["buckets"].options["only"].block
    trainer = SupernetTrainer(supernet, TrainConfig(batch_size=64, progress=False), data.split("train").ctr)
    assert any(p is shared.table.weight for p in trainer.sparse)  # the embedding tables' optimizer
    path = space.encode(space.decode(space.sample(np.random.default_rng(0))))
    path.update({"depth": 1, "L0.op": "attention", "dense.path": "fields", "dense.fields": "buckets"})
    assert any(g.op == "buckets" for g in space.decode(path).blocks)
    batch = next(data.split("train").batches(64, shuffle=False))
    before = shared.table.weight.detach().clone()
    for _ in range(3):  # the head's output layer starts at 0: the first step reaches no table
        trainer.step(batch, path)
        assert all(t is not shared.table.weight for t, _, _ in trainer.dense_opt.cuts)  # not Adam's cut
    assert bool(shared.ready)
    dense = supernet.plan(path).arch  # the edges are those of the first batch's standardized dense
    torch.testing.assert_close(shared.edges, bucket_edges(build_model(dense, data.spec).standardize(batch.dense), 16))
    assert not torch.equal(shared.table.weight.detach(), before)
    extracted = supernet.extract(path)  # a standalone model carries the shared edges
    block = next(b for b in extracted.blocks if isinstance(b, Buckets))
    assert torch.equal(block.edges, shared.edges) and bool(block.ready)


def _bucket_path(space):
    path = space.encode(space.decode(space.sample(np.random.default_rng(0))))
    path.update({"depth": 1, "L0.op": "attention", "dense.path": "fields", "dense.fields": "buckets"})
    return path


def _all_dense(split) -> torch.Tensor:
    return next(split.batches(len(split), shuffle=False)).dense


def test_a_training_sets_the_edges_from_the_train_split_not_its_first_batch(tmp_path: Path) -> None:
    data = tiny_click_data(tmp_path / "data", rows=512)  # a train split under EDGE_ROWS: all of it
    space = get_space("engineer", **SMALL_ENGINEER)
    model = build_model(space.decode(_bucket_path(space)), data.spec)
    block = next(b for b in model.blocks if isinstance(b, Buckets))
    with contextlib.suppress(TrialDiverged):  # one step ends no better than the base rate; the edges came first
        train_model(model, data, TrainConfig(batch_size=32, steps=1, val_batches=1, test_batches=1, progress=False))
    everything = bucket_edges(model.standardize(_all_dense(data.split("train"))), block.bins)
    first = bucket_edges(model.standardize(next(data.split("train").batches(32, shuffle=True, seed=0)).dense),
                         block.bins)
    torch.testing.assert_close(block.edges, everything)
    assert not torch.allclose(block.edges, first)  # what the first batch alone would have set


def test_a_supernet_sets_its_shared_edges_from_the_train_split(tmp_path: Path) -> None:
    data = tiny_click_data(tmp_path / "data", rows=512)
    space = get_space("engineer", **SMALL_ENGINEER)
    supernet = build_supernet(space, data.spec, 0)
    shared = supernet.ops["buckets"].options["only"].block
    set_bucket_edges(supernet, data.split("train"), seed=0)
    assert bool(shared.ready)
    torch.testing.assert_close(shared.edges, bucket_edges(supernet.standardize(_all_dense(data.split("train"))), 16))
    extracted = supernet.extract(_bucket_path(space))  # what a path runs with
    assert torch.equal(next(b for b in extracted.blocks if isinstance(b, Buckets)).edges, shared.edges)
