"""The one training protocol of every trained model: epochs, validation, early stopping, best state.

A model trains for at most ``train.max_epochs`` passes over the training split (``train.steps``,
when set, caps the batches; a pass is cut into batches of ``train.batch_size`` rows, a shorter last
batch joined to the one before it: :func:`~rankitect.data.clickdata.epoch_batches`), is validated on
the whole validation split at the end of every epoch (on large data every
:func:`validation_interval` steps instead), stops once ``train.patience`` validations in a row
brought no better validation NE, and gets back the weights of its best validation before it is
tested. The per-example validation losses of that best validation are kept too
(:attr:`Protocol.best_losses`): a search compares two models on the same rows with them (a paired
test, see :mod:`rankitect.search.judging.selection`). A search may also stop a training early through a
``report`` hook that is called after every validation with the best validation NE so far and raises
:class:`~rankitect.train.task.TrialPruned` (successive halving, see
:mod:`rankitect.search.judging.pruning`). A ``deadline`` (a ``time.time()`` instant: a search's time budget)
ends training at the first step past it with one more validation, so the training returns its best
state so far and says it was stopped (:attr:`Protocol.stopped`); an ``on_step`` hook sees every step
(progress display).

Honest results: a NaN or infinite loss or validation NE ends training as diverged at any step, and
so does a validation NE above :data:`DIVERGED_NE` (1.5) at or after ``train.grace_steps`` when no
validation before it was at or below 1.5: a model that far above the base rate has blown up, not
learned slowly. Every model starts at the base rate (its output bias at the log-odds of the
training click rate), so a healthy one validates near NE 1 at first; one that stays a little above
1 (a rare-click log, a slow learning rate) trains on, early stopping ends it when it stops
improving, and its best state is kept and ranked by its NE like any other, however poor. A model
that was below 1 and then rises above it is overfitting, not diverging: early stopping ends it and
its best state stays. A training whose best validation NE is above :data:`DIVERGED_NE` when it
ends (inside a grace as long as the training) fails as diverged.

>>> from rankitect.config import TrainConfig
>>> cfg = TrainConfig(batch_size=100, max_epochs=3)
>>> plan = Schedule.of(cfg, train_rows=1_050, val_rows=200)   # 10 batches an epoch, the last of 150 rows
>>> plan.epoch_steps, plan.total_steps, plan.interval
(10, 30, 10)
>>> Schedule.of(TrainConfig(batch_size=100, max_epochs=3, steps=20), 1_050, 200).total_steps
20
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

from rankitect.config import TrainConfig
from rankitect.data.clickdata import epoch_batches
from rankitect.errors import ConfigError
from rankitect.eval.evaluate import accumulate
from rankitect.train.task import TrialDiverged, TrialPruned

# On large data, validate often enough to stop within an epoch, yet keep validation (a forward
# pass, about a third of a training step per batch) near a sixth of the training time at most.
MIN_AUTO_INTERVAL = 2_000  # training steps between validations, at least (auto)
VAL_COST_FACTOR = 2  # ... and at least this many times the validation batches

# (validation index from 1, best validation NE so far, whether training ends here anyway); may raise
# TrialPruned. The best so far, not the latest: it is what the training returns if it stops here (its
# best state is restored), and a curve that swings from one validation to the next is not judged on a
# swing.
Report = Callable[[int, float, bool], None]

# (steps taken, total steps, epoch from 1, epochs) after every training step: what a progress display shows.
StepHook = Callable[[int, int, int, int], None]

BUDGET_STOP = "time budget"  # Protocol.stopped of a training ended at its deadline

# A validation NE above this (after train.grace_steps) ends a training as diverged: half as much loss
# again as predicting the base rate is a model that has blown up, while one that starts a little
# above 1 (its output drifted from the base rate before its features helped) is only slow.
DIVERGED_NE = 1.5


def deadline_passed(deadline: float | None, now: float | None = None) -> bool:
    """Whether the ``time.time()`` instant ``deadline`` has passed (``None``: there is none).

    >>> deadline_passed(None), deadline_passed(100.0, now=99.0), deadline_passed(100.0, now=100.0)
    (False, False, True)
    """
    return deadline is not None and (time.time() if now is None else now) >= deadline


@dataclass(frozen=True)
class Schedule:
    """Steps per epoch, total steps and the validation interval of one training."""

    epoch_steps: int
    total_steps: int
    interval: int

    @classmethod
    def of(cls, cfg: TrainConfig, train_rows: int, val_rows: int) -> Schedule:
        if train_rows < 1 or val_rows < 1:
            raise ValueError(f"training needs rows in the train and validation splits, got {train_rows} and {val_rows}")
        epoch = epoch_batches(train_rows, cfg.batch_size)
        total = epoch * cfg.max_epochs if cfg.steps is None else min(cfg.steps, epoch * cfg.max_epochs)
        interval = cfg.val_every or validation_interval(epoch, math.ceil(val_rows / cfg.batch_size))
        return cls(epoch_steps=epoch, total_steps=total, interval=max(1, min(interval, total)))

    @classmethod
    def for_data(cls, cfg: TrainConfig, data: Any) -> Schedule:
        """The schedule of training on ``data``'s train split, validated on its val split."""
        return cls.of(cfg, len(data.split("train")), len(data.split("val")))


def validation_interval(epoch_steps: int, val_batches: int) -> int:
    """``train.val_every=0`` (auto): once an epoch, or on an epoch longer than
    ``max(MIN_AUTO_INTERVAL, VAL_COST_FACTOR * val_batches)`` steps, every that many steps."""
    return min(epoch_steps, max(MIN_AUTO_INTERVAL, VAL_COST_FACTOR * val_batches))


def check_warmup(cfg: TrainConfig, total_steps: int | None = None) -> None:
    """A grace longer than the training (the divergence rule would never run) is a config error naming both keys."""
    steps = cfg.steps if total_steps is None else total_steps
    if steps is not None and cfg.grace_steps > steps:
        what = "train.steps" if total_steps is None or total_steps == cfg.steps else "train.max_epochs"
        raise ConfigError(f"config key 'train.grace_steps': {cfg.grace_steps} is longer than the training "
                          f"({what} gives {steps} steps); the divergence guard would never run")


class Protocol(pl.Callback):
    """Validates on schedule, keeps the best state, stops early and guards against divergence.

    Args:
        model: the module whose state is kept (the un-wrapped model, not a compiled twin).
        val_batches: a callable giving a fresh iterator over the validation batches.
        cfg: ``patience``, ``val_batches``, ``grace_steps``.
        schedule: when to validate.
        report: called after each validation with its index (from 1), the best validation NE so far
            and whether training ends there anyway; may raise.
        deadline: a ``time.time()`` instant; the first step past it is validated and ends training
            (:attr:`stopped` then says why). ``None``: no deadline.
        on_step: called after every training step (:data:`StepHook`).

    A ``report`` with a ``probe`` attribute ``p > 1`` (a search's rung study asking for an earlier
    first rung, :mod:`rankitect.search.judging.pruning`) also sees one *probe* validation at
    ``interval // p`` steps, reported as validation ``0``. It is read, not kept: no best state,
    patience or history counts it, so a training that goes on is the one without it.
    """

    def __init__(
        self, model: nn.Module, val_batches: Callable[[], Any], cfg: TrainConfig, schedule: Schedule,
        report: Report | None = None, *, deadline: float | None = None, on_step: StepHook | None = None,
    ) -> None:
        super().__init__()
        self.model, self.val_batches, self.cfg, self.schedule, self.report = model, val_batches, cfg, schedule, report
        self.deadline, self.on_step = deadline, on_step
        self.stopped: str | None = None  # BUDGET_STOP when the deadline ended the training
        self.history: list[dict[str, float]] = []
        self.best_ne = math.inf
        self.best_step = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_losses: np.ndarray | None = None  # per-example validation losses of the best validation
        self._since_best = 0
        self._last_validated = 0
        probe = int(getattr(report, "probe", 0) or 0)
        at = schedule.interval // probe if probe > 1 else 0
        self.probe_step = at if 1 <= at < schedule.interval else None  # see the class's docs
        self.probe_ne: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if self.on_step is not None:
            epochs = math.ceil(self.schedule.total_steps / self.schedule.epoch_steps)
            self.on_step(step, self.schedule.total_steps, min(epochs, trainer.current_epoch + 1), epochs)
        if deadline_passed(self.deadline) and not trainer.should_stop:
            self.stopped = BUDGET_STOP
            trainer.should_stop = True
            self.validate(trainer)  # the state at the deadline competes with the best so far
            return
        if step == self.probe_step and self.report is not None and self.stopped is None:
            self.probe(step, self.report)
        if step % self.schedule.interval == 0 or step >= self.schedule.total_steps:
            self.validate(trainer)

    def probe(self, step: int, report: Report) -> None:
        """The probe validation at ``step``: reported as validation 0 and kept nowhere else."""
        metrics = {f"val/{k}": float(v) for k, v in
                   accumulate(self.model, self.val_batches(), self.cfg.val_batches).compute().items()}
        ne = metrics["val/ne"]
        if not math.isfinite(ne):
            raise TrialDiverged(f"validation NE is {ne} at step {step}")
        self.probe_ne = ne
        try:
            report(0, ne, False)
        except TrialPruned as e:  # the probe is the whole partial curve
            raise TrialPruned(str(e), history=[{"step": float(step), **metrics}], best_ne=ne, steps=step) from None

    def on_train_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.validate(trainer)  # every epoch ends validated

    def validate(self, trainer: pl.Trainer) -> None:
        step = trainer.global_step
        if step == self._last_validated:
            return
        self._last_validated = step
        acc = accumulate(self.model, self.val_batches(), self.cfg.val_batches)
        metrics = {f"val/{k}": float(v) for k, v in acc.compute().items()}
        self.history.append({"step": float(step), **metrics})
        ne = metrics["val/ne"]
        if not math.isfinite(ne):
            raise TrialDiverged(f"validation NE is {ne} at step {step}")
        if ne > DIVERGED_NE and not self.best_ne <= DIVERGED_NE and step >= self.cfg.grace_steps:
            raise TrialDiverged(f"validation NE is {ne:.4f} at step {step}: above {DIVERGED_NE:g} after the "
                                f"grace (train.grace_steps={self.cfg.grace_steps})")
        if ne < self.best_ne:
            self.best_ne, self.best_step, self._since_best = ne, step, 0
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.best_losses = acc.example_losses().astype(np.float32)
        else:
            self._since_best += 1
            if self.cfg.patience and self._since_best >= self.cfg.patience:
                trainer.should_stop = True
        if self.report is not None and self.stopped is None:  # a stopped training is not judged on its cut
            final = trainer.should_stop or step >= self.schedule.total_steps
            try:
                self.report(len(self.history), self.best_ne, final)
            except TrialPruned as e:  # attach the partial curve for the trial's record
                raise TrialPruned(str(e), history=self.history, best_ne=self.best_ne, steps=step) from None

    def restore_best(self) -> None:
        """Load the best validated state; fail the training when none was validated or the best is
        above :data:`DIVERGED_NE` (diverged inside a grace as long as the training)."""
        if self.best_state is None or not self.best_ne <= DIVERGED_NE:
            raise TrialDiverged(f"best validation NE is {self.best_ne:.4f}: above {DIVERGED_NE:g}, diverged")
        self.model.load_state_dict(self.best_state)

    def best_metrics(self) -> dict[str, float]:
        """The ``val/*`` metrics of the best validation."""
        best = next(h for h in self.history if h["step"] == self.best_step)
        return {k: v for k, v in best.items() if k != "step"}
