"""What one-shot and DNAS share: training a supernet on paths, scoring a path, logging curves.

The supernet is trained like a candidate (:class:`~rankitect.train.task.RankingTask`): binary
cross-entropy, row-wise Adagrad on the embedding tables and Adam on everything else. Parameters a
path does not touch get no gradient (``None``), so their optimizer state stays as it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rankitect.config import TrainConfig
from rankitect.data.batch import Batch
from rankitect.eval.metrics import MetricAccumulator, entropy
from rankitect.space.supernet import Supernet
from rankitect.train.loop import BatchStream
from rankitect.train.task import split_parameters

Path = Mapping[str, Any]


def build_supernet(space: Any, spec: Any, seed: int) -> Supernet:
    """The supernet of ``space`` with weights drawn from ``seed`` (the global random state is kept)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Supernet(space, spec)


def batches(split: Any, batch_size: int, seed: int) -> Iterator[Batch]:
    """Shuffled batches of ``split`` forever, a new shuffle each epoch."""
    return iter(BatchStream(split, batch_size, shuffle=True, seed=seed, repeat=True))


class SupernetTrainer:
    """Steps a supernet's weights on training batches, one path per step.

    Args:
        supernet: the model whose weights are trained.
        cfg: learning rates and weight decay (those of candidate training).
        ctr: the training click rate; ``ne`` divides the loss by its entropy.
    """

    def __init__(self, supernet: nn.Module, cfg: TrainConfig, ctr: float) -> None:
        self.supernet = supernet
        sparse, dense = split_parameters(supernet)
        self.optimizers: list[torch.optim.Optimizer] = [
            RowWiseAdagrad(sparse, lr=cfg.lr_sparse),
            torch.optim.Adam(dense, lr=cfg.lr_dense, weight_decay=cfg.weight_decay),
        ]
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.base_entropy = entropy(ctr)
        if self.base_entropy <= 0:
            raise ValueError(f"the training click rate {ctr!r} has no entropy: NE is undefined")
        self.steps = 0

    def step(self, batch: Batch, path: Path) -> float:
        """One optimizer step on ``batch`` through ``path``; returns the loss."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.supernet(batch, path), batch.labels)
        if not torch.isfinite(loss):
            raise RuntimeError(f"supernet training diverged: loss {loss.item()} at step {self.steps}")
        loss.backward()
        for opt in self.optimizers:
            opt.step()
        self.steps += 1
        return float(loss.detach())

    def ne(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Differentiable NE of a batch: its mean log loss over the entropy of the training rate."""
        return self.loss_fn(logits, labels) / self.base_entropy


@torch.no_grad()
def evaluate_path(supernet: Supernet, path: Path, batches: Iterable[Batch]) -> dict[str, float]:
    """NE, logloss, AUC and calibration of one path with the supernet's weights."""
    was_training = supernet.training
    supernet.eval()
    acc = MetricAccumulator()
    try:
        for batch in batches:
            acc.update(supernet(batch, path), batch.labels)
    finally:
        supernet.train(was_training)
    return {k: float(v) for k, v in acc.compute().items()}


class CurveLogger:
    """Metrics of a long loop logged to one MLflow run in batches (``log_batch``), not one call each.

    Args:
        client: an ``mlflow.MlflowClient``.
        run_id: the run the curves belong to.
        flush_every: buffered values before a write (MLflow takes at most 1000 per call).
    """

    def __init__(self, client: Any, run_id: str, flush_every: int = 500) -> None:
        self.client, self.run_id, self.flush_every = client, run_id, min(flush_every, 1000)
        self._buffer: list[Any] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer += [Metric(k, float(v), now, step) for k, v in metrics.items() if math.isfinite(v)]
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        for i in range(0, len(self._buffer), 1000):
            self.client.log_batch(self.run_id, metrics=self._buffer[i:i + 1000])
        self._buffer = []


def start_child_run(tracker: Any, parent_id: str, name: str, kind: str) -> str:
    """A child run of the search ``parent_id`` tagged ``rankitect.kind=kind`` (e.g. ``supernet``)."""
    from rankitect.track.mlflow_tracker import KIND, PARENT

    run = tracker.client.create_run(tracker.experiment_id, run_name=name, tags={KIND: kind, PARENT: parent_id})
    return run.info.run_id


__all__ = ["CurveLogger", "SupernetTrainer", "batches", "build_supernet", "evaluate_path", "start_child_run"]
