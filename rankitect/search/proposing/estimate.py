"""How long a search will take, said before its first trial.

Each baseline's FLOPs per example are measured (:func:`~rankitect.cost.measure`) and a few of its
training steps are timed on this machine, on the search's data. A training's wall time lies
between two bounds at that pace (:class:`~rankitect.train.protocol.Schedule`), validations
included (a forward pass over the validation split, about a third of a step per batch): early
stopping ends it after ``train.patience + 1`` validations at the soonest, and its schedule
(``train.max_epochs``) at the latest. Most trainings end near the first bound (a model's best
validation comes early and patience ends it soon after), so the estimate says both, the first as
what to expect; a candidate is taken to cost what the baselines cost on average, and the
trainings run ``workers`` at a time. Once trials finish, the progress line's ETA comes from their
measured times instead.
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
    """Seconds a trial takes (the baselines' mean, stopped early at the soonest), the search's
    total at that pace and at most, and the line that says the estimate."""

    per_trial: float
    total: float
    line: str
    most: float = 0.0


def step_seconds(arch: Architecture, data: Any, cfg: TrainConfig, steps: int = TIMED_STEPS,
                 threads: int | None = None) -> float:
    """Wall seconds of one training step of ``arch`` on ``data`` (the mean of ``steps`` timed ones),
    with the optimizers a trial uses and ``threads`` torch threads (``None``: this process's); the
    caller's random state and threads are kept."""
    from rankitect.space import build_model
    from rankitect.train.optim import RowWiseAdagrad
    from rankitect.train.task import split_parameters

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _timed_steps(arch, data, cfg, steps, build_model, RowWiseAdagrad, split_parameters)
    finally:
        torch.set_num_threads(before)


def _timed_steps(arch: Architecture, data: Any, cfg: TrainConfig, steps: int, build_model: Any, adagrad: Any,
                 split_parameters: Any) -> float:
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = build_model(arch, data.spec)
        sparse, dense = split_parameters(model)
        opts = [adagrad(sparse, lr=cfg.lr_sparse)] if sparse else []
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


def trial_seconds(step: float, data: Any, cfg: TrainConfig, *, early: bool = False) -> float:
    """A trial's wall time at ``step`` seconds a step: every step of its schedule and its validations;
    ``early``: stopped by early stopping at the soonest, after ``patience + 1`` validations.

    >>> from rankitect.config import TrainConfig
    >>> class Data:  # 100 training batches of 10 rows an epoch, 3 validation batches
    ...     def split(self, name): return range(1000 if name == "train" else 30)
    >>> cfg = TrainConfig(batch_size=10, max_epochs=20, patience=2)
    >>> trial_seconds(1.0, Data(), cfg), trial_seconds(1.0, Data(), cfg, early=True)
    (2020.0, 303.0)
    """
    from rankitect.train.protocol import Schedule

    schedule = Schedule.for_data(cfg, data)
    steps = schedule.total_steps
    if early and cfg.patience:
        steps = min(steps, (cfg.patience + 1) * schedule.interval)
    val_batches = math.ceil(len(data.split("val")) / cfg.batch_size)
    if cfg.val_batches:
        val_batches = min(val_batches, cfg.val_batches)
    validations = math.ceil(steps / schedule.interval)
    return step * (steps + validations * val_batches * FORWARD_SHARE)


def estimate_search(baselines: dict[str, Architecture], data: Any, cfg: TrainConfig, *, trials_left: int,
                    workers: int = 1, threads: int | None = None, budget_left: float | None = None,
                    supernet: bool = False) -> Estimate | None:
    """The :class:`Estimate` of a search with ``trials_left`` trials to run (``baselines`` among
    them, by name) ``workers`` at a time, from the baselines timed here, capped by the time budget
    left (seconds, if any), each training on ``threads`` torch threads; ``supernet``: the strategy
    trains one first (not in the estimate).
    ``None`` without baselines to time."""
    from rankitect.cost import measure

    if not baselines or trials_left <= 0:
        return None
    mflops = [measure(arch, data.spec).mflops for arch in baselines.values()]
    steps = [step_seconds(arch, data, cfg, threads=threads) for arch in baselines.values()]
    soon = sum(trial_seconds(s, data, cfg, early=True) for s in steps) / len(steps)
    late = sum(trial_seconds(s, data, cfg) for s in steps) / len(steps)
    rounds = math.ceil(trials_left / max(1, workers))
    total, most = soon * rounds, late * rounds
    who = f"{workers} at a time" if workers > 1 else "one at a time"
    stop = f"after {cfg.patience + 1} validations at train.patience {cfg.patience}" if cfg.patience else "never"
    line = (f"estimate: {trials_left} trainings, {who}; the baselines ({min(mflops):.3g}-{max(mflops):.3g} MFLOPs "
            f"per example, a few steps timed here) take {_minutes(soon)} each where early stopping ends them "
            f"soonest ({stop}), {_minutes(late)} at most ({_schedule(cfg, data)}): about {_minutes(total)}, "
            f"at most {_minutes(most)}" + (", and the supernet phase first" if supernet else ""))
    if budget_left is not None and budget_left < most:
        total, most = min(total, budget_left), budget_left
        line += f"; the time budget ends it after {_minutes(budget_left)}"
    return Estimate(per_trial=soon, total=total, line=line, most=most)


def _schedule(cfg: TrainConfig, data: Any) -> str:
    """A training's schedule in words: ``20 epochs of 79,845 rows``."""
    rows = len(data.split("train"))
    return f"{cfg.max_epochs} epochs of {rows:,} rows" if cfg.steps is None else f"{cfg.steps:,} steps"


def _minutes(seconds: float) -> str:
    """``12 s``, ``3.4 min``.

    >>> _minutes(12.3), _minutes(204)
    ('12 s', '3.4 min')
    """
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
