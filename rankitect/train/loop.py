"""Train one model or architecture under the training protocol and score it on validation and test.

Every trained model (search candidates, baselines, retrains of one-shot and DNAS winners,
fine-tuning) goes through :func:`train_model`: see :mod:`rankitect.train.protocol` for the
epochs, validations, early stopping and best-state restore it applies.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from rankitect.blocks.buckets import EDGE_ROWS, unset_buckets
from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.data.batch import Batch
from rankitect.eval.evaluate import accumulate, evaluate
from rankitect.train.protocol import Protocol, Report, Schedule, StepHook, check_warmup
from rankitect.train.task import RankingTask


@dataclass
class TrainResult:
    """What training one candidate gives back.

    ``metrics`` holds ``val/*`` (of the best validation, whose weights ``model`` holds) and
    ``test/*`` (ne, logloss, auc, calibration); ``history`` the validation metrics at every
    validation during training; ``best_step`` the step of the best validation.
    """

    model: nn.Module
    metrics: dict[str, float]
    train_seconds: float
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    best_step: int = 0
    val_losses: np.ndarray | None = None  # per-example validation losses of the best validation, in row order
    test_losses: np.ndarray | None = None  # per-example test losses of the returned model (test/* scored them)
    # per-example losses of the returned model on the data's held-out verdict rows, where it has them
    # (ClickData.with_verdict); never part of ``metrics``: nothing but a search's final choice reads them
    verdict_losses: np.ndarray | None = None
    held_out_seconds: float | None = None  # what scoring those rows took (None without them)
    stopped: str | None = None  # why training ended before its protocol said so (protocol.BUDGET_STOP), if it did
    probe_ne: float | None = None  # validation NE at the probe of a search's rung study, where it asked for one


class BatchStream(IterableDataset):
    """Training batches of one split; every pass is a new shuffle (seed ``seed + pass``); ``repeat``
    cycles passes forever. A final batch smaller than ``batch_size`` joins the one before it
    (:func:`~rankitect.data.clickdata.epoch_batches` says why). An empty split is refused: a loop
    over it would never yield."""

    def __init__(self, split: Any, batch_size: int, *, shuffle: bool, seed: int, repeat: bool) -> None:
        super().__init__()
        if len(split) == 0:
            raise ValueError(f"the {getattr(split, 'name', '?')} split has no rows")
        self.split, self.batch_size, self.shuffle, self.seed, self.repeat = split, batch_size, shuffle, seed, repeat
        self.passes = 0

    def __iter__(self) -> Iterator[Batch]:
        while True:
            seed = self.seed + self.passes
            self.passes += 1
            yield from self.split.batches(self.batch_size, shuffle=self.shuffle, seed=seed, merge_last=True)
            if not self.repeat:
                return


def _identity(batch: Batch) -> Batch:
    return batch


def _loader(split: Any, batch_size: int, *, shuffle: bool, seed: int, repeat: bool) -> DataLoader:
    stream = BatchStream(split, batch_size, shuffle=shuffle, seed=seed, repeat=repeat)
    return DataLoader(stream, batch_size=None, collate_fn=_identity, num_workers=0)


def make_trainer(
    cfg: TrainConfig, schedule: Schedule, *, callbacks: list[pl.Callback] | None = None, accelerator: str = "cpu",
    precision: str = "32-true",
) -> pl.Trainer:
    """A Lightning trainer that runs the training batches only; validation is the protocol's."""
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=cfg.max_epochs,
        max_steps=schedule.total_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=cfg.progress,
        callbacks=callbacks or [],
    )


def train_model(
    model: nn.Module, data: Any, cfg: TrainConfig, *, steps: int | None = None,
    callbacks: list[pl.Callback] | None = None, runtime: RuntimeConfig | None = None,
    report: Report | None = None, deadline: float | None = None, on_step: StepHook | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``data.split("train")`` under the protocol, then score val and test.

    ``steps`` overrides ``cfg.steps`` (the cap). ``report`` is called after every validation,
    ``on_step`` after every step; past ``deadline`` (a ``time.time()`` instant) training ends with
    one more validation and ``stopped`` says so (see :class:`~rankitect.train.protocol.Protocol`). ``runtime`` (None: eager fp32 on the CPU) may
    compile the training forward or convert safe layers to FP8 (see :mod:`rankitect.train.runtime`);
    compile time counts in ``train_seconds``. ``runtime.precision=bf16`` trains under bf16
    autocast (Lightning's ``bf16-mixed``); validations and the returned scores run in float32.
    Raises :class:`~rankitect.train.task.TrialDiverged` when training diverges (see
    :mod:`rankitect.train.protocol`), and whatever ``report`` raises.
    """
    if steps is not None:
        cfg = replace(cfg, steps=steps)
    logging.getLogger("pytorch_lightning.utilities.rank_zero").setLevel(logging.WARNING)
    start = time.perf_counter()
    trained = model
    if runtime is not None:  # refuses a runtime this machine cannot run before any data is read
        from rankitect.train.runtime import prepare_training

        trained = prepare_training(model, data, cfg, runtime)
    train, val = data.split("train"), data.split("val")
    set_bucket_edges(model, train, cfg.seed)
    schedule = Schedule.for_data(cfg, data)
    check_warmup(cfg, schedule.total_steps)
    protocol = Protocol(model, lambda: val.batches(cfg.batch_size, shuffle=False), cfg, schedule, report,
                        deadline=deadline, on_step=on_step)
    accelerator = "gpu" if runtime is not None and runtime.device.startswith("cuda") else "cpu"
    precision = "bf16-mixed" if runtime is not None and runtime.precision == "bf16" else "32-true"
    trainer = make_trainer(cfg, schedule, callbacks=[protocol, *(callbacks or [])], accelerator=accelerator,
                           precision=precision)
    train_dl = _loader(train, cfg.batch_size, shuffle=True, seed=cfg.seed, repeat=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
        warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*")
        warnings.filterwarnings("ignore", message=".*You defined a `validation_step` but have no `val_dataloader`.*")
        trainer.fit(RankingTask(trained, cfg), train_dataloaders=train_dl)
    protocol.restore_best()
    seconds = time.perf_counter() - start
    test = scored(model, data.split("test"), cfg.batch_size, cfg.test_batches)
    metrics = {**protocol.best_metrics(), **{f"test/{k}": float(v) for k, v in test.compute().items()}}
    held_start = time.perf_counter()
    verdict = held_out_losses(model, data, cfg.batch_size)
    held = None if verdict is None else time.perf_counter() - held_start
    return TrainResult(model=model, metrics=metrics, train_seconds=seconds, steps=trainer.global_step,
                       history=protocol.history, best_step=protocol.best_step, val_losses=protocol.best_losses,
                       stopped=protocol.stopped, test_losses=test.example_losses().astype(np.float32),
                       verdict_losses=verdict, held_out_seconds=held, probe_ne=protocol.probe_ne)


def scored(model: nn.Module, split: Any, batch_size: int, max_batches: int = 0) -> Any:
    """``model``'s :class:`~rankitect.eval.metrics.MetricAccumulator` over ``split`` in storage order
    (the first ``max_batches`` batches when > 0): its metrics and its per-example losses."""
    return accumulate(model, split.batches(batch_size, shuffle=False, seed=0), max_batches)


def held_out_losses(model: nn.Module, data: Any, batch_size: int) -> np.ndarray | None:
    """``model``'s per-example losses on ``data``'s verdict rows (float32, storage order); ``None``
    where the data has none (:meth:`~rankitect.data.clickdata.ClickData.with_verdict`)."""
    if not getattr(data, "has_verdict", False):
        return None
    return scored(model, data.split("verdict"), batch_size).example_losses().astype(np.float32)


def score(model: nn.Module, data: Any, cfg: TrainConfig, splits: tuple[str, ...] = ("val", "test")) -> dict[str, float]:
    """``val/*`` over ``cfg.val_batches`` batches and ``test/*`` over ``cfg.test_batches`` (0 = all)."""
    out: dict[str, float] = {}
    limits = {"val": cfg.val_batches, "test": cfg.test_batches}
    for split in splits:
        batches = data.split(split).batches(cfg.batch_size, shuffle=False, seed=0)
        out.update({f"{split}/{k}": v for k, v in evaluate(model, batches, limits[split]).items()})
    return out


def train_architecture(arch: Any, data: Any, cfg: TrainConfig, **kw: Any) -> TrainResult:
    """Build ``arch`` for ``data.spec`` with seed ``cfg.seed`` and train it (see :func:`train_model`).

    The new model starts at the base rate (:func:`start_at_base_rate`). The global torch RNG is
    forked, so seeding here leaves the caller's random state untouched.
    """
    from rankitect.space import build_model

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = build_model(arch, data.spec)
        start_at_base_rate(model, data.split("train").ctr)
        return train_model(model, data, cfg, **kw)


def start_at_base_rate(model: nn.Module, ctr: float) -> None:
    """Set the bias of the output layer (``model.head.mlp[-1]``) to the log-odds of ``ctr``, so an
    untrained model predicts the training click rate on average instead of 0.5 (the prior
    initialization of Lin et al. 2017): the first epochs fit features instead of the base rate."""
    head = getattr(getattr(model, "head", None), "mlp", None)
    last = head[-1] if isinstance(head, nn.Sequential) and len(head) else None
    if isinstance(last, nn.Linear) and last.bias is not None and 0.0 < ctr < 1.0:
        with torch.no_grad():
            last.bias.fill_(base_rate_logit(ctr))


def base_rate_logit(ctr: float) -> float:
    """The logit whose sigmoid is ``ctr``: ``log(ctr / (1 - ctr))``, an output bias at the base rate.

    >>> round(base_rate_logit(0.2), 4)
    -1.3863
    """
    if not 0.0 < ctr < 1.0:
        raise ValueError(f"the click rate must be in (0, 1), got {ctr!r}")
    return math.log(ctr / (1.0 - ctr))


def edge_rows(split: Any, seed: int, rows: int | None = None) -> Batch:
    """``rows`` (default ``EDGE_ROWS``; all of a smaller split) shuffled rows of ``split``, one batch."""
    return next(iter(split.batches(max(1, min(rows or EDGE_ROWS, len(split))), shuffle=True, seed=seed)))


def set_bucket_edges(model: nn.Module, split: Any, seed: int) -> None:
    """Set the edges of ``model``'s unset :class:`~rankitect.blocks.buckets.Buckets` blocks from
    :func:`edge_rows` of ``split``: one forward in training mode without gradients and without a
    step (their data-dependent initialization), instead of from the first mini-batch, on the
    device of the model's weights. A model without such blocks is left alone."""
    if not unset_buckets(model) or len(split) == 0:
        return
    device = next(model.parameters()).device
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            model(edge_rows(split, seed).to(device))
    finally:
        model.train(was_training)
