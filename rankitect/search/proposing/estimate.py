"""How long a search will take, said before its first trial.

Each baseline's FLOPs per example are measured (:func:`~rankitect.cost.measure`) and a few of its
training steps are timed on this machine, on the search's data; a trial's wall time is then at
most its steps (:class:`~rankitect.train.protocol.Schedule`: epochs of the training split) at that
pace, plus its validations (a forward pass over the validation split, about a third of a step per
batch). A candidate is taken to cost what the baselines cost on average. Early stopping ends most
trainings sooner, so this is an upper bound; once trials finish, the progress line's ETA comes
from their measured times instead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankitect.config import TrainConfig
from rankitect.space.architecture import Architecture

TIMED_STEPS = 3  # after one untimed step (first-call allocations)
FORWARD_SHARE = 1 / 3  # a validation batch (forward only) against a training step (forward and backward)


@dataclass(frozen=True)
class Estimate:
    """Seconds a trial takes at most (the baselines' mean) and the line that says the estimate."""

    per_trial: float
    total: float
    line: str


def step_seconds(arch: Architecture, data: Any, cfg: TrainConfig, steps: int = TIMED_STEPS) -> float:
    """Wall seconds of one training step of ``arch`` on ``data`` (the mean of ``steps`` timed ones),
    with the optimizers a trial uses; the caller's random state is kept."""
    from rankitect.space import build_model
    from rankitect.train.optim import RowWiseAdagrad
    from rankitect.train.task import split_parameters

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = build_model(arch, data.spec)
        sparse, dense = split_parameters(model)
        opts = [RowWiseAdagrad(sparse, lr=cfg.lr_sparse)] if sparse else []
        opts += [torch.optim.Adam(dense, lr=cfg.lr_dense)] if dense else []
        loss_fn = nn.BCEWithLogitsLoss()
        batches = data.split("train").batches(cfg.batch_size, shuffle=True, seed=cfg.seed)
        start = 0.0
        for i, batch in zip(range(steps + 1), batches):
            if i == 1:
                start = time.perf_counter()
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss_fn(model(batch), batch.labels).backward()
            for opt in opts:
                opt.step()
        return (time.perf_counter() - start) / max(1, min(steps, i))


def trial_seconds(step: float, data: Any, cfg: TrainConfig) -> float:
    """A trial's wall time at most at ``step`` seconds a step: every step of its schedule and its
    validations."""
    from rankitect.train.protocol import Schedule

    schedule = Schedule.for_data(cfg, data)
    val_batches = math.ceil(len(data.split("val")) / cfg.batch_size)
    if cfg.val_batches:
        val_batches = min(val_batches, cfg.val_batches)
    validations = math.ceil(schedule.total_steps / schedule.interval)
    return step * (schedule.total_steps + validations * val_batches * FORWARD_SHARE)


def estimate_search(baselines: dict[str, Architecture], data: Any, cfg: TrainConfig, *, trials_left: int,
                    workers: int = 1, budget_left: float | None = None) -> Estimate | None:
    """The :class:`Estimate` of a search with ``trials_left`` trials to run (``baselines`` among
    them, by name), from the baselines timed here, capped by the time budget left (seconds, if
    any); ``None`` without baselines to time."""
    from rankitect.cost import measure
    from rankitect.train.protocol import Schedule

    if not baselines or trials_left <= 0:
        return None
    mflops = [measure(arch, data.spec).mflops for arch in baselines.values()]
    seconds = [trial_seconds(step_seconds(arch, data, cfg), data, cfg) for arch in baselines.values()]
    per_trial = sum(seconds) / len(seconds)
    total = per_trial * trials_left / max(1, workers)
    schedule = Schedule.for_data(cfg, data)
    rows = len(data.split("train"))
    epochs = f"{cfg.max_epochs} epochs of {rows:,} rows" if cfg.steps is None else f"{rows:,} training rows"
    line = (f"estimate: {trials_left} trials of at most {schedule.total_steps:,} steps ({epochs}); the baselines "
            f"({min(mflops):.3g}-{max(mflops):.3g} MFLOPs per example) take {_minutes(min(seconds))}-"
            f"{_minutes(max(seconds))} each here (a few steps timed): about {_minutes(total)} at most, "
            f"less where early stopping ends trainings")
    if budget_left is not None and budget_left < total:
        total = budget_left
        line += f"; the time budget ends it after {_minutes(budget_left)}"
    return Estimate(per_trial=per_trial, total=total, line=line)


def _minutes(seconds: float) -> str:
    """``12 s``, ``3.4 min``.

    >>> _minutes(12.3), _minutes(204)
    ('12 s', '3.4 min')
    """
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
