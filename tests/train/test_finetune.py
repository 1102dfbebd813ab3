"""Fine-tuning keeps the weights that validate better: the trained ones, or the start given back
exactly. Training and scoring are stand-ins here whose NE is read off the weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rankitect.config import TrainConfig
from rankitect.train import finetune as ft
from rankitect.train.loop import TrainResult
from rankitect.train.task import TrialDiverged


def _score(model: nn.Module, data: object, cfg: TrainConfig) -> dict[str, float]:
    ne = float(model.weight.detach().sum())  # the stand-in NE: the sum of the weights
    return {"val/ne": ne, "test/ne": ne + 0.01}


def _training_to(weights: float | None):
    """A stand-in training run that sets every weight to ``weights`` (None: it diverges)."""
    def train(model: nn.Module, data: object, cfg: TrainConfig, *, runtime: object = None,
              on_step: object = None) -> TrainResult:
        if weights is None:
            raise TrialDiverged("val/ne never below 1")
        with torch.no_grad():
            model.weight.fill_(weights)
        return TrainResult(model=model, metrics=_score(model, data, cfg), train_seconds=2.0, steps=5,
                           history=[{"step": 5, "val/ne": weights * 4}])
    return train


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    monkeypatch.setattr(ft, "score", _score)
    net = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.1, 0.2], [0.3, 0.2]]))  # NE 0.8
    return net


def test_better_validation_keeps_the_trained_weights(model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ft, "train_model", _training_to(0.1))  # NE 0.4
    out = ft.finetune_model(model, None, TrainConfig())
    assert not out.kept_start and out.after["val/ne"] == pytest.approx(0.4)
    assert out.before["val/ne"] == pytest.approx(0.8) and torch.all(model.weight == 0.1)
    assert out.train_seconds == 2.0 and out.history == [{"step": 5, "val/ne": pytest.approx(0.4)}]
    assert "improved" in out.verdict() and "keeps the fine-tuned weights" in out.verdict()


@pytest.mark.parametrize("weights", [0.3, None], ids=["worse", "diverged"])
def test_no_better_validation_gives_the_start_back(model: nn.Module, monkeypatch: pytest.MonkeyPatch,
                                                   weights: float | None) -> None:
    start = model.weight.detach().clone()
    monkeypatch.setattr(ft, "train_model", _training_to(weights))
    out = ft.finetune_model(model, None, TrainConfig())
    assert out.kept_start and torch.equal(model.weight, start)
    assert out.after == out.before and out.after["val/ne"] == pytest.approx(0.8)
    assert "did not improve" in out.verdict() and "keeps the starting weights" in out.verdict()


def test_from_scratch_keeps_the_trained_weights_and_lets_divergence_fail(model: nn.Module,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ft, "train_model", _training_to(0.3))  # worse than the start, but there is none to keep
    out = ft.finetune_model(model, None, TrainConfig(), from_scratch=True)
    assert not out.kept_start and torch.all(model.weight == 0.3)
    monkeypatch.setattr(ft, "train_model", _training_to(None))
    with pytest.raises(TrialDiverged):
        ft.finetune_model(model, None, TrainConfig(), from_scratch=True)
