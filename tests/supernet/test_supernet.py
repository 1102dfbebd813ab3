"""The supernet: a path computes what the standalone model of its architecture computes with the cut
weights, FLOPs agree with the analytic cost, narrower choices reuse the first units, gates carry gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.data.spec import FeatureSpec
from rankitect.space import build_model, cost, get_space
from rankitect.supernet.model import Supernet
from rankitect.space.testing import tiny_batch
from tests.space.conftest import SMALL_NASREC, small_space


def perturbed(supernet: Supernet, seed: int) -> Supernet:
    """Move every weight off its initial value, so that no slice is accidentally equal to another."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in supernet.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return supernet


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_fixed_path_equals_extracted_standalone_model(preset: str, spec: FeatureSpec) -> None:
    space = small_space(preset)
    supernet = perturbed(Supernet(space, spec), 0)
    batch = tiny_batch(spec, 8, seed=3)
    rng = np.random.default_rng(7)
    for _ in range(50):
        # training mode (batch norms on batch statistics in both); no dropout: the supernet draws its own masks
        path = {**space.sample(rng), "recipe.dropout": 0.0}
        model = supernet.extract(path)
        assert type(model) is type(build_model(space.decode(path), spec))
        torch.manual_seed(0)  # training mode: both draw the same dropout masks
        got = supernet(batch, path)
        torch.manual_seed(0)
        worst = (got - model(batch)).abs().max().item()
        assert worst <= 1e-5, (space.decode(path).to_json(), worst)


def test_history_paths_equal_their_extracted_models_and_cost() -> None:
    """The engineer space on data with a history: every history op at every knob, cut exactly."""
    from rankitect.space.testing import tiny_spec
    from tests.space.conftest import SMALL_ENGINEER

    spec = tiny_spec(history=5)
    space = get_space("engineer", **SMALL_ENGINEER, history="h0")
    supernet = perturbed(Supernet(space, spec), 1)
    batch = tiny_batch(spec, 8, seed=3)
    rng, seen = np.random.default_rng(7), set()
    for _ in range(60):
        path = {**space.sample(rng), "recipe.dropout": 0.0}
        seen.add(path["history.op"])
        model = supernet.extract(path)
        torch.manual_seed(0)
        got = supernet(batch, path)
        torch.manual_seed(0)
        worst = (got - model(batch)).abs().max().item()
        assert worst <= 1e-5, (space.decode(path).to_json(), worst)
        assert supernet.path_flops(path) == cost(space.decode(path), spec).flops
    assert seen == {"none", "pool", "target", "transformer", "cross"}


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_path_flops_are_the_analytic_cost(preset: str, spec: FeatureSpec) -> None:
    space = small_space(preset)
    supernet = Supernet(space, spec)
    rng = np.random.default_rng(11)
    for _ in range(50):
        path = space.sample(rng)
        assert supernet.path_flops(path) == cost(space.decode(path), spec).flops


def _slot0_mlp(space, rng: np.random.Generator, width: int) -> dict:
    path = space.sample(rng)
    path.update({"b0.flat": "mlp", "b0.width": width})
    return path


def test_narrower_width_is_the_first_units_of_the_wider(spec: FeatureSpec) -> None:
    space = small_space("nasrec")
    supernet = perturbed(Supernet(space, spec), 1)
    path = _slot0_mlp(space, np.random.default_rng(0), 24)
    narrow, wide = supernet.extract({**path, "b0.width": 8}), supernet.extract(path)
    mlp = [i for i, g in enumerate(narrow.arch.blocks) if g.op == "mlp" and g.inputs == ("dense",)][0]
    w_narrow, w_wide = narrow.blocks[mlp].layers[0].weight, wide.blocks[mlp].layers[0].weight
    assert w_narrow.shape == (8, spec.n_dense) and w_wide.shape == (24, spec.n_dense)
    torch.testing.assert_close(w_narrow, w_wide[:8], rtol=0, atol=0)


def test_an_input_keeps_its_columns_whatever_else_is_read(spec: FeatureSpec) -> None:
    space = small_space("nasrec")
    supernet = perturbed(Supernet(space, spec), 2)
    path = {**_slot0_mlp(space, np.random.default_rng(1), 16), "b1.flat": "mlp", "b1.width": 16}
    alone = supernet.extract({**path, "b1.in0": "raw", "b1.in1": "none"})
    joined = supernet.extract({**path, "b1.in0": "raw", "b1.in1": "0"})

    def slot1_mlp(model) -> torch.Tensor:
        steps = supernet.plan(space.encode(model.arch)).steps
        i = next(i for i, step in enumerate(steps) if step.role.key == "b1.flat/mlp")
        return model.blocks[i].layers[0].weight

    assert slot1_mlp(joined).shape[1] > spec.n_dense
    # Dense features come first in both inputs; their weights are the same cut.
    torch.testing.assert_close(slot1_mlp(alone), slot1_mlp(joined)[:, : spec.n_dense], rtol=0, atol=0)


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_unit_gates_change_nothing_and_carry_gradient(preset: str, spec: FeatureSpec) -> None:
    space = small_space(preset)
    supernet = perturbed(Supernet(space, spec), 3)
    batch = tiny_batch(spec, 8)
    path = {**supernet.widest_path(np.random.default_rng(4)), "recipe.dropout": 0.0}  # no dropout draws
    gates = {label: torch.ones((), requires_grad=True) for label in space.choices}
    torch.manual_seed(0)  # training mode: both draw the same dropout masks
    logits = supernet(batch, path, gates)
    torch.manual_seed(0)
    torch.testing.assert_close(logits, supernet(batch, path))
    logits.square().sum().backward()
    decides = {"nasrec": ["b0.flat", "b0.width", "b1.in0"], "engineer": ["depth", "L0.op", "top.layers"]}[preset]
    for label in decides:
        assert gates[label].grad is not None and gates[label].grad != 0, label


def test_extract_accepts_an_architecture_and_rejects_foreign_ones(spec: FeatureSpec) -> None:
    space = small_space("nasrec")
    supernet = perturbed(Supernet(space, spec), 4)
    path = {**space.sample(np.random.default_rng(5)), "recipe.dropout": 0.0}  # no dropout draws
    arch = space.decode(path)
    batch = tiny_batch(spec, 4)
    model = supernet.extract(arch)
    torch.manual_seed(0)  # training mode: both draw the same dropout masks
    want = supernet(batch, path)
    torch.manual_seed(0)
    torch.testing.assert_close(model(batch), want, rtol=0, atol=1e-6)
    foreign = get_space("engineer", embedding_dim=4).decode(get_space("engineer", embedding_dim=4).sample(
        np.random.default_rng(0)))
    with pytest.raises(ValueError, match="not in space"):
        supernet.extract(foreign)


def test_widest_path_takes_the_largest_options(spec: FeatureSpec) -> None:
    space = get_space("nasrec", **{**SMALL_NASREC, "num_blocks": 3})
    path = Supernet(space, spec).widest_path(np.random.default_rng(0))
    assert all(path[f"b{k}.width"] == 24 and path[f"b{k}.tokens"] == 6 for k in range(3))


def test_rocs_paths_are_refused(spec: FeatureSpec) -> None:
    space = get_space("nasrec", **SMALL_NASREC, rocs=True)
    with pytest.raises(ValueError, match="ROCS"):
        Supernet(space, spec).plan(space.sample(np.random.default_rng(0)))


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_every_path_starts_at_the_training_click_rate(preset: str, spec: FeatureSpec) -> None:
    """A supernet handed to its trainer predicts the training click rate on every path, whatever
    its head depth, as a new standalone model does (before: 0.5 until that depth's own output layer
    had been stepped to the base rate)."""
    from rankitect.config import TrainConfig
    from rankitect.supernet.train import SupernetTrainer

    space, ctr = small_space(preset), 0.13
    supernet = Supernet(space, spec)
    SupernetTrainer(supernet, TrainConfig(progress=False), ctr)
    batch = tiny_batch(spec, 16, seed=5)
    rng = np.random.default_rng(2)
    for _ in range(20):
        probs = torch.sigmoid(supernet(batch, space.sample(rng)))
        torch.testing.assert_close(probs, torch.full_like(probs, ctr))


def test_head_counts_keep_attention_weights_of_their_own(spec: FeatureSpec) -> None:
    """A step on a path whose first layer is 2-head attention moves that layer's weights and leaves
    the 1-head layer's as they were: heads split the projections differently, so they share none."""
    from rankitect.config import TrainConfig
    from rankitect.supernet.train import SupernetTrainer

    space = small_space("engineer")
    supernet = Supernet(space, spec)
    rng = np.random.default_rng(4)
    path = {**space.sample(rng), "depth": 1, "L0.op": "attention", "L0.attention.heads": 2}
    one_head = {**path, "L0.attention.heads": 1}

    def qkv(p: dict) -> torch.Tensor:
        return supernet.extract(p).blocks[space.decode(p).blocks.index(
            next(g for g in space.decode(p).blocks if g.op == "attention"))].qkv.weight.detach().clone()

    before_two, before_one = qkv(path), qkv(one_head)
    assert not torch.equal(before_two, before_one)  # drawn apart at the start, too
    trainer = SupernetTrainer(supernet, TrainConfig(progress=False), 0.3)
    for seed in range(3):  # the output layer starts at zero: the body gets a gradient from the second step
        trainer.step(tiny_batch(spec, 16, seed=seed), path)
    assert not torch.equal(qkv(path), before_two)
    assert torch.equal(qkv(one_head), before_one)
