"""A batch norm takes a batch of one row (the last of an epoch, a probe): by its running
statistics, left unchanged, or (without them) by the row's own, which map it to the bias."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rankitect.blocks.common import BatchNorm, make_norm
from rankitect.config import TrainConfig
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.builder import build_model
from rankitect.space.pricing import price
from rankitect.space.testing import tiny_batch, tiny_spec
from rankitect.train.loop import train_architecture
from tests.search.tiny_data import tiny_click_data


def stepped(norm: nn.BatchNorm1d) -> nn.BatchNorm1d:
    """``norm`` after one training batch, with an affine map off its start (statistics not 0 and 1)."""
    torch.manual_seed(0)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    norm.train()(3.0 + 2.0 * torch.randn(16, norm.num_features))
    return norm


def test_more_rows_are_what_torch_batch_norm_computes() -> None:
    ours, theirs = stepped(BatchNorm(4)), stepped(nn.BatchNorm1d(4))
    x = torch.randn(5, 4)
    assert torch.equal(ours.train()(x), theirs.train()(x))
    assert torch.equal(ours.running_mean, theirs.running_mean) and torch.equal(ours.running_var, theirs.running_var)
    assert torch.equal(ours.eval()(x), theirs.eval()(x))


def test_one_row_in_training_is_normalized_by_the_running_statistics_and_leaves_them() -> None:
    norm = stepped(BatchNorm(4))
    mean, var, seen = norm.running_mean.clone(), norm.running_var.clone(), int(norm.num_batches_tracked)
    x = torch.randn(1, 4, requires_grad=True)
    y = norm.train()(x)
    want = (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias  # the textbook formula
    assert torch.allclose(y, want, atol=1e-6)
    assert torch.equal(norm.running_mean, mean) and torch.equal(norm.running_var, var)
    assert int(norm.num_batches_tracked) == seen
    y.sum().backward()
    assert x.grad is not None and norm.weight.grad is not None


def test_one_row_without_running_statistics_gives_the_bias() -> None:
    norm = stepped(BatchNorm(4, track_running_stats=False))
    x = torch.randn(1, 4, requires_grad=True)
    for training in (True, False):
        y = norm.train(training)(x)
        assert torch.equal(y, norm.bias.detach().unsqueeze(0))  # (x - mean(x)) = 0, then the affine map
        y.sum().backward()
        assert x.grad is not None and torch.equal(x.grad, torch.zeros_like(x))


def test_the_batchnorm_key_builds_this_norm() -> None:
    assert type(make_norm("batchnorm", 4)) is BatchNorm


def batch_norm_arch() -> Architecture:
    """Batch norms in an MLP block and in the head."""
    return Architecture((BlockGene("mlp", ("dense", "sparse"), {"width": 8, "norm": "batchnorm"}),),
                        HeadGene((0,), (4,), norm="batchnorm"), 4)


def test_a_model_with_batch_norms_trains_on_one_row_and_is_priced() -> None:
    spec = tiny_spec()
    model = build_model(batch_norm_arch(), spec).train()
    model(tiny_batch(spec, 1)).sum().backward()
    assert all(p.grad is not None for p in model.dense_parameters())
    assert price(batch_norm_arch(), spec).bytes(64) > 0  # meta forwards in training mode run


def test_an_epoch_that_leaves_one_row_over_trains(tmp_path: Path) -> None:
    data = tiny_click_data(tmp_path / "data", rows=1025, spec=tiny_spec())  # 32 batches of 32 and one row over
    cfg = TrainConfig(max_epochs=1, batch_size=32, lr_dense=1e-2, val_batches=0, test_batches=1, progress=False)
    result = train_architecture(batch_norm_arch(), data, cfg)
    assert result.steps == 32 and result.metrics["val/ne"] < 1.0  # the row joined the last batch
