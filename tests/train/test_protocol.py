"""The training protocol: epochs, early stopping on a planted validation curve, best state restored,
divergence before and after warm-up, warm-up longer than training refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import rankitect.train.protocol as protocol
from rankitect.config import TrainConfig, load_config
from rankitect.errors import ConfigError
from rankitect.space.baselines import get_baseline
from rankitect.train.loop import train_architecture
from rankitect.train.protocol import Schedule, validation_interval
from rankitect.train.task import TrialDiverged, TrialPruned

from ..planted import Scored
from ..search.tiny_data import tiny_click_data

ROWS, BATCH = 1024, 64  # 16 training steps an epoch
EPOCH = ROWS // BATCH


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return tiny_click_data(tmp_path_factory.mktemp("protocol") / "tiny", rows=ROWS)


def _cfg(**kw) -> TrainConfig:
    return replace(TrainConfig(batch_size=BATCH, progress=False, test_batches=2), **kw)


class Planted:
    """Stands in for ``accumulate`` during training: returns the planted NE curve, one value per
    validation, and keeps a copy of the model's weights at each validation."""

    def __init__(self, curve: list[float]) -> None:
        self.curve, self.states, self.steps = list(curve), [], []

    def __call__(self, model, batches, max_batches=0):
        self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        ne = self.curve[len(self.states) - 1]
        return Scored(ne, ne * 0.5)


def _train(data, cfg: TrainConfig, curve: list[float], monkeypatch: pytest.MonkeyPatch, **kw):
    planted = Planted(curve)
    monkeypatch.setattr(protocol, "accumulate", planted)
    arch = get_baseline("dlrm", data.spec)
    return train_architecture(arch, data, cfg, **kw), planted


def test_early_stopping_restores_the_best_validation(data, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = [0.95, 0.90, 0.80, 0.85, 0.83, 0.70, 0.60]  # best at validation 3, then 2 without a better one
    out, planted = _train(data, _cfg(max_epochs=7, patience=2), curve, monkeypatch)
    assert len(out.history) == 5  # stopped after the 5th validation (patience 2)
    assert out.steps == 5 * EPOCH  # one validation per epoch on small data
    assert out.best_step == 3 * EPOCH
    assert out.metrics["val/ne"] == 0.80
    best = planted.states[2]
    for k, v in out.model.state_dict().items():
        assert torch.equal(v, best[k]), k
    later = planted.states[4]  # training did move the weights after the best validation
    assert any(not torch.equal(v, later[k]) for k, v in out.model.state_dict().items())


def test_patience_zero_trains_every_epoch_and_keeps_the_best(data, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = [0.9, 0.7, 0.8, 0.85]
    out, planted = _train(data, _cfg(max_epochs=4, patience=0), curve, monkeypatch)
    assert len(out.history) == 4 and out.steps == 4 * EPOCH and out.best_step == 2 * EPOCH
    for k, v in out.model.state_dict().items():
        assert torch.equal(v, planted.states[1][k]), k


def test_step_cap_ends_training_with_a_validation(data, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = _train(data, _cfg(max_epochs=5, steps=EPOCH + 5), [0.9, 0.8, 0.7], monkeypatch)
    assert out.steps == EPOCH + 5
    assert [h["step"] for h in out.history] == [EPOCH, EPOCH + 5]  # the cut epoch is validated too


@pytest.mark.parametrize("warmup", [0, 2 * EPOCH, 4 * EPOCH])  # NaN after, at and before the warm-up's end
def test_divergence_fails_before_and_after_warmup(data, monkeypatch: pytest.MonkeyPatch, warmup: int) -> None:
    with pytest.raises(TrialDiverged, match="validation NE is nan at step 32"):
        _train(data, _cfg(max_epochs=4, grace_steps=warmup), [0.9, float("nan"), 0.8, 0.8], monkeypatch)


def test_nan_loss_fails_before_and_after_warmup(data, monkeypatch: pytest.MonkeyPatch) -> None:
    from rankitect.space import build_model
    from rankitect.train.loop import train_model

    for warmup in (0, 3 * EPOCH):
        model = build_model(get_baseline("dlrm", data.spec), data.spec)
        with torch.no_grad():
            next(p for n, p in model.named_parameters() if "weight" in n and p.dim() == 2 and "embedding" not in n).fill_(float("nan"))
        with pytest.raises(TrialDiverged, match="training loss is nan at step 0"):
            train_model(model, data, _cfg(max_epochs=3, grace_steps=warmup))


def test_far_above_one_after_the_grace_fails_at_once(data, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(max_epochs=5, grace_steps=2 * EPOCH)  # validation 2 (step 32) is the first past the grace
    with pytest.raises(TrialDiverged, match="validation NE is 1.6000 at step 32: above 1.5 after the grace"):
        _train(data, cfg, [1.7, 1.6, 0.8, 0.8, 0.8], monkeypatch)
    out, _ = _train(data, _cfg(max_epochs=3, grace_steps=2 * EPOCH), [1.6, 0.9, 1.1], monkeypatch)
    assert out.metrics["val/ne"] == 0.9  # far above 1 inside the grace is allowed


def test_a_slow_start_a_little_above_one_trains_on(data, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rare-click model starts near NE 1 and may validate above it first: not a divergence.
    out, planted = _train(data, _cfg(max_epochs=4), [1.03, 1.01, 0.97, 0.95], monkeypatch)
    assert out.metrics["val/ne"] == 0.95 and len(out.history) == 4


def test_a_model_never_below_one_is_kept_and_ranked_by_its_ne(data, monkeypatch: pytest.MonkeyPatch) -> None:
    out, planted = _train(data, _cfg(max_epochs=4, patience=2), [1.04, 1.02, 1.03, 1.05], monkeypatch)
    assert out.metrics["val/ne"] == 1.02 and out.best_step == 2 * EPOCH and len(out.history) == 4
    for k, v in out.model.state_dict().items():
        assert torch.equal(v, planted.states[1][k]), k


def test_rising_far_above_one_after_a_good_start_is_overfitting(data, monkeypatch: pytest.MonkeyPatch) -> None:
    out, planted = _train(data, _cfg(max_epochs=6, patience=0), [0.9, 0.8, 1.2, 1.7, 0.7, 0.75], monkeypatch)
    assert len(out.history) == 6 and out.metrics["val/ne"] == 0.7 and out.best_step == 5 * EPOCH
    for k, v in out.model.state_dict().items():
        assert torch.equal(v, planted.states[4][k]), k


def test_overfitting_above_one_is_stopped_not_failed(data, monkeypatch: pytest.MonkeyPatch) -> None:
    out, planted = _train(data, _cfg(max_epochs=5, patience=2), [0.95, 1.02, 1.10, 0.5, 0.5], monkeypatch)
    assert len(out.history) == 3 and out.metrics["val/ne"] == 0.95 and out.best_step == EPOCH


def test_divergence_inside_the_grace_fails_when_training_ends(data, monkeypatch: pytest.MonkeyPatch) -> None:
    # Early stopping ends training at validation 3 (step 48), inside the grace (64 steps, as long
    # as the training: allowed), so no validation stopped it; its best is still above 1.5.
    cfg = _cfg(max_epochs=4, patience=1, grace_steps=4 * EPOCH)
    with pytest.raises(TrialDiverged, match="best validation NE is 1.7000: above 1.5, diverged"):
        _train(data, cfg, [1.8, 1.7, 1.75, 1.7], monkeypatch)


def test_nan_validation_fails_at_any_step(data, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TrialDiverged, match="nan"):
        _train(data, _cfg(max_epochs=3, grace_steps=3 * EPOCH), [0.9, float("nan"), 0.8], monkeypatch)


def test_warmup_longer_than_training_is_refused(data) -> None:
    arch = get_baseline("dlrm", data.spec)
    with pytest.raises(ConfigError, match=r"train\.grace_steps.*train\.max_epochs gives 32 steps"):
        train_architecture(arch, data, _cfg(max_epochs=2, grace_steps=33))
    with pytest.raises(ConfigError, match=r"train\.grace_steps.*train\.steps gives 10 steps"):
        protocol.check_warmup(_cfg(steps=10, grace_steps=20))


def test_search_refuses_a_warmup_longer_than_training_before_reading_data(tmp_path: Path, monkeypatch, capsys) -> None:
    from rankitect.cli import main

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    code = main(["search", "train.steps=10", "train.grace_steps=20", f"track.uri=sqlite:///{tmp_path}/m.db"])
    assert code == 2
    err = capsys.readouterr().err
    assert "train.grace_steps" in err and "train.steps" in err
    assert not (tmp_path / "data").exists() and not (tmp_path / "m.db").exists()


def test_report_can_stop_training_and_keeps_the_partial_curve(data, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def report(index: int, ne: float, final: bool) -> None:
        seen.append((index, ne, final))
        if index == 2:
            raise TrialPruned("stop here")

    with pytest.raises(TrialPruned) as e:
        _train(data, _cfg(max_epochs=5), [0.9, 0.8, 0.7, 0.6, 0.5], monkeypatch, report=report)
    assert seen == [(1, 0.9, False), (2, 0.8, False)]
    assert [h["val/ne"] for h in e.value.history] == [0.9, 0.8] and e.value.best_ne == 0.8
    assert e.value.steps == 2 * EPOCH


def test_report_gets_the_best_validation_so_far(data, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    _train(data, _cfg(max_epochs=4, patience=0), [0.9, 0.7, 0.8, 0.75], monkeypatch,
           report=lambda index, ne, final: seen.append((index, ne, final)))
    assert seen == [(1, 0.9, False), (2, 0.7, False), (3, 0.7, False), (4, 0.7, True)]


class ProbingReport:
    """A rung study's report asking for a probe at a third of the interval; it may stop there."""

    probe = 3

    def __init__(self, stop_at_probe: bool = False) -> None:
        self.seen: list[tuple[int, float, bool]] = []
        self.stop_at_probe = stop_at_probe

    def __call__(self, index: int, ne: float, final: bool) -> None:
        self.seen.append((index, ne, final))
        if index == 0 and self.stop_at_probe:
            raise TrialPruned("stopped at the probe")


def test_a_probe_is_one_more_validation_that_changes_nothing_of_the_training(data, monkeypatch) -> None:
    """The probe (validation 0, at interval // 3 steps) is reported, and the training that goes on is
    the one without it: the same curve, the same best step and the same weights."""
    curve = [0.9, 0.8, 0.85, 0.86]
    torch.manual_seed(0)
    plain, _ = _train(data, _cfg(max_epochs=4), curve, monkeypatch, report=lambda *a: None)
    report = ProbingReport()
    torch.manual_seed(0)
    probed, planted = _train(data, _cfg(max_epochs=4), [0.95, *curve], monkeypatch, report=report)
    assert report.seen[0] == (0, 0.95, False) and [s[0] for s in report.seen] == [0, 1, 2, 3, 4]
    assert len(planted.states) == 5  # the probe and four validations (patience 2 stops at the fourth)
    assert probed.history == plain.history and probed.best_step == plain.best_step == 2 * EPOCH
    for name, tensor in plain.model.state_dict().items():
        assert torch.equal(probed.model.state_dict()[name], tensor), name


def test_a_trial_stopped_at_the_probe_keeps_the_probe_as_its_curve(data, monkeypatch) -> None:
    with pytest.raises(TrialPruned) as e:
        _train(data, _cfg(max_epochs=3), [0.97, 0.9, 0.8, 0.7], monkeypatch, report=ProbingReport(stop_at_probe=True))
    assert e.value.steps == EPOCH // 3 and e.value.best_ne == 0.97
    assert [(h["step"], h["val/ne"]) for h in e.value.history] == [(EPOCH // 3, 0.97)]


def test_no_probe_without_a_report_asking_for_one_or_inside_a_one_step_interval(data, monkeypatch) -> None:
    seen = []
    _train(data, _cfg(max_epochs=2, patience=0), [0.9, 0.8], monkeypatch,
           report=lambda index, ne, final: seen.append(index))
    assert seen == [1, 2]
    report = ProbingReport()
    _train(data, _cfg(max_epochs=1, val_every=2), [0.9] * 20, monkeypatch, report=report)
    assert 0 not in [s[0] for s in report.seen]  # 2 // 3 steps: no room for a probe before the first validation


def test_schedule_matches_the_textbook_counts() -> None:
    cfg = TrainConfig(batch_size=512, max_epochs=20)
    small = Schedule.of(cfg, 80_000, 10_000)  # 156 steps an epoch (the last of 128 + 512 rows): validate every epoch
    assert (small.epoch_steps, small.total_steps, small.interval) == (156, 3120, 156)
    big = Schedule.of(cfg, 40_000_000, 5_000_000)  # 78,125 steps, 9,766 validation batches
    assert big.epoch_steps == 78_125 and big.interval == 2 * 9_766
    assert validation_interval(10_000, 10) == 2_000
    assert Schedule.of(replace(cfg, val_every=50), 80_000, 10_000).interval == 50


def test_a_training_pass_has_as_many_batches_as_the_schedule_counts_and_none_short(tmp_path) -> None:
    from rankitect.train.loop import BatchStream

    data = tiny_click_data(tmp_path / "odd", rows=1_200)  # a train split that batches of 64 do not divide
    train = data.split("train")
    assert len(train) % BATCH  # the case at stake: a short final batch to merge
    sizes = [len(b) for b in BatchStream(train, BATCH, shuffle=True, seed=0, repeat=False)]
    assert sum(sizes) == len(train) and min(sizes) >= BATCH
    assert len(sizes) == Schedule.of(_cfg(), len(train), 100).epoch_steps == len(train) // BATCH


def test_defaults_are_the_protocol() -> None:
    cfg = load_config().train
    assert cfg.steps is None and cfg.max_epochs >= 10 and cfg.patience >= 1 and cfg.val_batches == 0
