"""Training and fine-tuning take the genotype's recipe: its learning rates, also through wrappers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rankitect.config import TrainConfig
from rankitect.space.builder import build_model
from rankitect.space.recipe import Recipe
from rankitect.train import task as task_module
from rankitect.train.finetune import finetune_model
from rankitect.train.task import RankingTask, recipe_of
from tests.search.tiny_data import tiny_click_data
from tests.space.test_recipe import full_arch, mixed_spec


class Wrapper(nn.Module):
    """A training wrapper as DDP holds its model (``module``)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_the_recipe_is_found_through_wrappers() -> None:
    model = build_model(full_arch(), mixed_spec())
    assert recipe_of(Wrapper(Wrapper(model))) == full_arch().recipe
    assert recipe_of(nn.Linear(2, 1)) == Recipe()


def test_the_l2_term_through_a_wrapper_equals_the_direct_one() -> None:
    from rankitect.space.testing import tiny_batch

    model = build_model(full_arch(), mixed_spec()).eval()
    batch = tiny_batch(mixed_spec(), 4)
    direct = RankingTask(model, TrainConfig()).loss(batch)
    wrapped = Wrapper(model)
    wrapped.forward = model.forward  # type: ignore[method-assign]
    assert RankingTask(wrapped, TrainConfig()).loss(batch).item() == pytest.approx(direct.item(), rel=1e-6)


def test_finetuning_trains_at_the_genotypes_learning_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, ...]] = []
    original = task_module.RankingTask.configure_optimizers

    def recording(self: RankingTask) -> list[torch.optim.Optimizer]:
        opts = original(self)
        seen.append(tuple(o.param_groups[0]["lr"] for o in opts))
        return opts

    monkeypatch.setattr(task_module.RankingTask, "configure_optimizers", recording)
    spec = mixed_spec()
    data = tiny_click_data(tmp_path / "data", rows=512, spec=spec)
    model = build_model(full_arch(), spec)
    cfg = TrainConfig(max_epochs=1, steps=4, batch_size=32, lr_dense=1e-3, lr_sparse=0.05, progress=False)
    finetune_model(model, data, cfg)  # a run that does not help keeps its start: the rates are what counts
    assert seen == [(pytest.approx(0.05 * 0.5), pytest.approx(1e-3 * 2.0))]
