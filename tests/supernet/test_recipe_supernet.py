"""Recipe genes in the supernet: table widths by slicing the widest tables and projections, dropout
and norms as path choices; a cut model computes what the path computes with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.config import TrainConfig
from rankitect.space import cost, get_space
from rankitect.space.recipe_space import PREFIX
from rankitect.space.testing import tiny_batch
from rankitect.supernet.model import Supernet
from rankitect.supernet.train import SupernetTrainer
from tests.space.conftest import SMALL_ENGINEER, SMALL_NASREC
from tests.space.test_recipe import mixed_spec
from tests.supernet.test_supernet import perturbed

OFF_DEFAULT = {  # every recipe gene off today's value, one at a time (D = 4: widths 1, 2 and 8)
    "dim_small": 1, "dim_medium": 2, "dim_large": 8, "dropout": 0.3, "norm": "batchnorm", "head_norm": "layernorm",
    "embedding_l2": 1e-3, "lr_dense": 2.0, "lr_sparse": 0.5,
}


def spaces() -> list:
    return [get_space("nasrec", **SMALL_NASREC, head_widths=(8,)), get_space("engineer", **SMALL_ENGINEER)]


def same_logits(supernet: Supernet, path: dict, batch) -> float:
    """Largest gap between the path and its cut model, both in the supernet's mode."""
    model = supernet.extract(path).train(supernet.training)
    return (supernet(batch, path) - model(batch)).abs().max().item()


@pytest.mark.parametrize("space", spaces(), ids=lambda s: s.name)
@pytest.mark.parametrize("gene", sorted(OFF_DEFAULT))
def test_each_recipe_gene_cuts_exactly(space, gene: str) -> None:
    spec = mixed_spec()
    supernet = perturbed(Supernet(space, spec), 0)
    batch = tiny_batch(spec, 8, seed=2)
    rng = np.random.default_rng(3)
    defaults = {PREFIX + g: space.choices[PREFIX + g].options[0] for g in space.recipe_genes}
    for _ in range(8):
        path = {**space.sample(rng), **defaults, PREFIX + gene: OFF_DEFAULT[gene]}
        # Training mode, where batch norms use batch statistics in both (dropout draws differ: none here) ...
        if gene != "dropout":
            assert same_logits(supernet.train(), path, batch) <= 1e-5, space.decode(path).to_json()
        # ... and evaluation, where dropout is off (batch norms: batch statistics in the supernet only).
        if gene != "norm":
            assert same_logits(supernet.eval(), path, batch) <= 1e-5, space.decode(path).to_json()


def test_tables_and_projections_are_the_first_columns_of_the_widest() -> None:
    spec = mixed_spec()
    space = get_space("engineer", **SMALL_ENGINEER)
    supernet = perturbed(Supernet(space, spec), 1)
    assert supernet.table_width == 8 and sorted(supernet.projections) == ["large", "medium", "small"]
    path = {**space.sample(np.random.default_rng(0)), PREFIX + "dim_small": 2, PREFIX + "dim_medium": None,
            PREFIX + "dim_large": 8}
    model = supernet.extract(path)
    for f in spec.sparse:
        d = model.embedding.table(f.name).shape[1]
        assert d == {5: 2, 8: 2, 150: 4, 300: 4}.get(f.vocab_size, 8)
        assert torch.equal(model.embedding.table(f.name), supernet.embedding.table(f.name)[:, :d])
    assert sorted(model.embedding.projections) == ["large", "small"]
    assert torch.equal(model.embedding.projections["small"].weight, supernet.projections["small"].weight[:, :2])


@pytest.mark.parametrize("space", spaces(), ids=lambda s: s.name)
def test_path_flops_with_recipe_genes_are_the_analytic_cost(space) -> None:
    spec = mixed_spec()
    supernet = Supernet(space, spec)
    rng = np.random.default_rng(5)
    for _ in range(20):
        path = space.sample(rng)
        assert supernet.path_flops(path) == cost(space.decode(path), spec).flops


def test_dropout_draws_are_the_supernets_own_and_leave_the_global_state() -> None:
    spec = mixed_spec()
    space = get_space("nasrec", **SMALL_NASREC, head_widths=(8,))
    path = {**space.sample(np.random.default_rng(2)), PREFIX + "dropout": 0.3}
    batch = tiny_batch(spec, 8)

    def run() -> list[torch.Tensor]:
        torch.manual_seed(0)
        supernet = perturbed(Supernet(space, spec), 0)
        state = torch.get_rng_state()
        out = [supernet(batch, path).detach() for _ in range(2)]
        assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is kept
        return out

    first = run()
    assert not torch.equal(*first)  # a new draw per forward
    torch.manual_seed(123)  # whatever the global state, a supernet built the same way draws the same masks
    assert all(torch.equal(a, b) for a, b in zip(first, run()))


def test_a_supernet_step_trains_the_cut_projection_and_norms_only() -> None:
    spec = mixed_spec()
    space = get_space("nasrec", **SMALL_NASREC, head_widths=(8,))
    supernet = Supernet(space, spec)
    trainer = SupernetTrainer(supernet, TrainConfig(progress=False), 0.3)
    path = {**space.sample(np.random.default_rng(6)), PREFIX + "dim_small": 2, PREFIX + "dropout": 0.2,
            PREFIX + "norm": "batchnorm", PREFIX + "head_norm": "batchnorm"}
    before = supernet.projections["small"].weight.detach().clone()
    head_norm = supernet.head.norms[0].weight.detach().clone()
    # two steps: the output layers start at zero, so the first moves only them
    loss = [trainer.step(tiny_batch(spec, 16, seed=s), path) for s in (1, 2)][-1]
    after = supernet.projections["small"].weight.detach()
    assert np.isfinite(loss)
    assert not torch.equal(after[:, :2], before[:, :2]) and torch.equal(after[:, 2:], before[:, 2:])
    assert not torch.equal(supernet.head.norms[0].weight.detach(), head_norm)


def test_recipe_labels_that_change_the_forward_have_gates_with_gradient() -> None:
    spec = mixed_spec()
    space = get_space("engineer", **SMALL_ENGINEER)
    supernet = perturbed(Supernet(space, spec), 2).eval()
    path = {**space.sample(np.random.default_rng(8)), PREFIX + "dim_small": 2}
    gates = {label: torch.ones((), requires_grad=True) for label in space.choices}
    batch = tiny_batch(spec, 8)
    logits = supernet(batch, path, gates)
    torch.testing.assert_close(logits, supernet(batch, path))
    logits.square().sum().backward()
    for gene in ("dim_small", "dim_medium", "dim_large", "dropout", "norm", "head_norm"):
        assert gates[PREFIX + gene].grad is not None and gates[PREFIX + gene].grad != 0, gene
    for gene in ("embedding_l2", "lr_dense", "lr_sparse"):  # no part of the supernet's forward
        assert gates[PREFIX + gene].grad is None, gene
