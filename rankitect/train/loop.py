"""Train one model or architecture for a step budget and score it on validation and test."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.data.batch import Batch
from rankitect.eval.evaluate import evaluate
from rankitect.train.task import RankingTask


@dataclass
class TrainResult:
    """What training one candidate gives back.

    ``metrics`` holds ``val/*`` and ``test/*`` (ne, logloss, auc, calibration); ``history`` the
    validation metrics at every validation during training.
    """

    model: nn.Module
    metrics: dict[str, float]
    train_seconds: float
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)


class BatchStream(IterableDataset):
    """Batches of one split; ``repeat`` cycles epochs forever with a new shuffle seed each."""

    def __init__(self, split: Any, batch_size: int, *, shuffle: bool, seed: int, repeat: bool) -> None:
        super().__init__()
        self.split, self.batch_size, self.shuffle, self.seed, self.repeat = split, batch_size, shuffle, seed, repeat

    def __iter__(self) -> Iterator[Batch]:
        if len(self.split) == 0:  # ``repeat`` would spin forever on zero batches
            raise ValueError(f"the {getattr(self.split, 'name', '')} split is empty: nothing to iterate")
        epoch = 0
        while True:
            yield from self.split.batches(self.batch_size, shuffle=self.shuffle, seed=self.seed + epoch)
            epoch += 1
            if not self.repeat:
                return


def _identity(batch: Batch) -> Batch:
    return batch


def _loader(split: Any, batch_size: int, *, shuffle: bool, seed: int, repeat: bool) -> DataLoader:
    stream = BatchStream(split, batch_size, shuffle=shuffle, seed=seed, repeat=repeat)
    return DataLoader(stream, batch_size=None, collate_fn=_identity, num_workers=0)


def make_trainer(
    cfg: TrainConfig, *, max_steps: int, callbacks: list[pl.Callback] | None = None, accelerator: str = "cpu",
    precision: str = "32-true",
) -> pl.Trainer:
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=max_steps,
        val_check_interval=max(1, min(cfg.val_every, max_steps)),
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.val_batches if cfg.val_batches > 0 else 1.0,
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
) -> TrainResult:
    """Train ``model`` in place on ``data.split("train")``, then score val and test.

    ``runtime`` (None: eager fp32 on the CPU) may compile the training forward or convert safe
    layers to FP8 (see :mod:`rankitect.train.runtime`); compile time counts in ``train_seconds``.
    ``runtime.precision=bf16`` trains and validates under bf16 autocast (Lightning's
    ``bf16-mixed``: matrix products in bfloat16, weights, optimizer state and the loss in float32);
    the returned val/test scores run in float32 on the trained weights.
    Raises :class:`~rankitect.train.task.TrialDiverged` when training diverges.
    """
    steps = cfg.steps if steps is None else steps
    logging.getLogger("pytorch_lightning.utilities.rank_zero").setLevel(logging.WARNING)
    start = time.perf_counter()
    trained = model
    if runtime is not None:
        from rankitect.train.runtime import prepare_training

        trained = prepare_training(model, data, cfg, runtime)
    task = RankingTask(trained, cfg)
    accelerator = "gpu" if runtime is not None and runtime.device.startswith("cuda") else "cpu"
    precision = "bf16-mixed" if runtime is not None and runtime.precision == "bf16" else "32-true"
    trainer = make_trainer(cfg, max_steps=steps, callbacks=callbacks, accelerator=accelerator, precision=precision)
    train_dl = _loader(data.split("train"), cfg.batch_size, shuffle=True, seed=cfg.seed, repeat=True)
    val_dl = _loader(data.split("val"), cfg.batch_size, shuffle=False, seed=0, repeat=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
        warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*")
        trainer.fit(task, train_dataloaders=train_dl, val_dataloaders=val_dl)
    seconds = time.perf_counter() - start
    metrics = score(model, data, cfg)
    return TrainResult(model=model, metrics=metrics, train_seconds=seconds, steps=trainer.global_step,
                       history=task.history)


def score(model: nn.Module, data: Any, cfg: TrainConfig) -> dict[str, float]:
    """``val/*`` over ``cfg.val_batches`` batches and ``test/*`` over ``cfg.test_batches`` (0 = all)."""
    out: dict[str, float] = {}
    for split, limit in (("val", cfg.val_batches), ("test", cfg.test_batches)):
        batches = data.split(split).batches(cfg.batch_size, shuffle=False, seed=0)
        out.update({f"{split}/{k}": v for k, v in evaluate(model, batches, limit).items()})
    return out


def train_architecture(arch: Any, data: Any, cfg: TrainConfig, **kw: Any) -> TrainResult:
    """Build ``arch`` for ``data.spec`` with seed ``cfg.seed`` and train it (see :func:`train_model`).

    The global torch RNG is forked, so seeding here leaves the caller's random state untouched.
    """
    from rankitect.space import build_model

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = build_model(arch, data.spec)
        return train_model(model, data, cfg, **kw)
