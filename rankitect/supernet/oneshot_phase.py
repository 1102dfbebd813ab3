"""The one-shot phase: a supernet trained by uniform single-path sampling, and paths scored on its weights.

After NASRec (Zhang et al., WWW'23, arXiv 2207.07187):

* **Training** (:func:`train_supernet`): each step draws a path of the space uniformly; during
  warm-up the widest path is drawn instead with a probability falling linearly from 1 to 0 over
  ``widest_decay_steps`` (:func:`widest_probability`), so every weight gets trained early. Like DNAS's,
  the training is sized to the data (:func:`oneshot_schedule`): ``supernet.steps`` or ``supernet.epochs``
  passes over the train split, whichever is fewer, the warm-up keeping its share of the steps.
* **Scoring** (:class:`ChildScorer`, :func:`score`): a path's weights are cut from the supernet,
  its head is fine-tuned for ``finetune_steps`` steps on the features of ``finetune_batches``
  fixed training batches, and its NE on ``score_batches`` validation batches is its result.

The ``oneshot`` strategy (:mod:`rankitect.search.strategies.oneshot`) runs evolution on these
scores and retrains the best.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from rankitect.config import OneShotConfig, TrainConfig
from rankitect.data.batch import Batch, concat_batches
from rankitect.eval.metrics import MetricAccumulator
from rankitect.eval.result import TrialResult
from rankitect.space.architecture import Architecture
from rankitect.supernet.model import Supernet
from rankitect.supernet.train import CurveLogger, SupernetTrainer, batches, set_bucket_edges, supernet_schedule
from rankitect.train.protocol import deadline_passed


def oneshot_schedule(cfg: OneShotConfig, train_rows: int, batch_size: int) -> tuple[int, int]:
    """Supernet steps and warm-up steps (the widest path's probability reaching 0) on ``train_rows``
    training rows (:func:`~rankitect.supernet.train.supernet_schedule`).

    >>> oneshot_schedule(OneShotConfig(), 80_000, 512), oneshot_schedule(OneShotConfig(), 10**6, 512)
    ((156, 52), (600, 200))
    """
    return supernet_schedule(cfg.supernet.steps, cfg.widest_decay_steps, cfg.supernet.epochs, train_rows, batch_size)


def widest_probability(step: int, warmup_steps: int) -> float:
    """Probability of drawing the widest path at ``step``: 1 at step 0, falling linearly to 0.

    >>> [widest_probability(s, 4) for s in (0, 2, 4, 9)], widest_probability(0, 0)
    ([1.0, 0.5, 0.0, 0.0], 0.0)
    """
    return max(0.0, 1.0 - step / warmup_steps) if warmup_steps > 0 else 0.0


def train_supernet(
    supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: OneShotConfig, *, seed: int,
    curves: CurveLogger | None = None, progress: bool = False, deadline: float | None = None,
    on_step: Callable[[int, int], None] | None = None, echo: Callable[[str], None] | None = None,
) -> list[float]:
    """Train ``supernet`` for the steps of :func:`oneshot_schedule` on ``data``, one path a step;
    returns the losses. Past ``deadline`` (a ``time.time()`` instant: the search's time budget) it
    stops with the weights it has; ``on_step(step, steps)`` sees every step; ``echo`` is told the
    schedule, and where the time budget stopped it."""
    steps, warmup = oneshot_schedule(cfg, len(data.split("train")), train_cfg.batch_size)
    if echo is not None:
        echo(f"oneshot: supernet of {sum(p.numel() for p in supernet.parameters()):,} parameters, "
             f"{steps} steps (widest-path warm-up over {warmup})")
    rng = np.random.default_rng(seed)
    trainer = SupernetTrainer(supernet, train_cfg, data.split("train").ctr)
    set_bucket_edges(supernet, data.split("train"), train_cfg.seed)
    stream = batches(data.split("train"), train_cfg.batch_size, train_cfg.seed)
    losses, taken = [], []
    bar = tqdm(range(steps), desc="supernet", disable=not progress, dynamic_ncols=True)
    for step in bar:
        p_widest = widest_probability(step, warmup)
        path = supernet.widest_path(rng) if rng.random() < p_widest else supernet.space.sample(rng)
        skipped = trainer.skipped
        losses.append(trainer.step(next(stream), path))
        taken.append(trainer.skipped == skipped)
        every = cfg.supernet.log_every
        if step % every == 0 or step == steps - 1:
            window = [loss for loss, ok in zip(losses[-every:], taken[-every:]) if ok]
            row = {"train/loss": float(np.mean(window)) if window else math.nan,
                   "train/skipped": 1.0 - float(np.mean(taken[-every:])), "train/p_widest": p_widest}
            bar.set_postfix(loss=f"{row['train/loss']:.4f}", skipped=trainer.skipped)
            if curves is not None:
                curves.log(step, row)
        if on_step is not None:
            on_step(step + 1, steps)
        if deadline_passed(deadline):
            break
    if echo is not None and deadline_passed(deadline):
        echo(f"oneshot: supernet stopped by the time budget after {len(losses)} of {steps} steps")
    return losses


class ChildScorer:
    """Scores paths with inherited weights: head fine-tuned on fixed features, NE on fixed batches.

    The frozen body runs once per child on all fine-tune rows and once on all validation rows (each
    set as one batch: a path's weights are cut twice, not once per batch); the head's steps then
    take the fine-tune batches' features one batch at a time.

    Args:
        supernet: the trained supernet (left unchanged).
        finetune: training batches whose features the head is fine-tuned on (the same for every child).
        val: validation batches the child is scored on (the same for every child).
        lr: Adam's learning rate for the head.
        steps: head steps, one batch's features each, cycling over ``finetune``.
    """

    def __init__(self, supernet: Supernet, finetune: list[Batch], val: list[Batch], lr: float, steps: int) -> None:
        self.supernet, self.lr, self.steps = supernet, lr, steps
        self.finetune = concat_batches(finetune) if finetune else None
        self.sizes = [len(b) for b in finetune]
        self.labels = [b.labels for b in finetune]
        self.val = concat_batches(val)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def __call__(self, path: dict[str, Any]) -> dict[str, float]:
        """Validation metrics (NE, logloss, AUC, calibration) of ``path`` after the head's fine-tune."""
        was_training = self.supernet.training
        self.supernet.eval()
        try:
            head = self.supernet.plan(path).head
            params = {k: v.detach().clone().requires_grad_() for k, v in self.supernet.head_params(path).items()}
            if self.finetune is not None and self.steps:
                opt = torch.optim.Adam(params.values(), lr=self.lr)
                with torch.no_grad():  # the body is frozen: its features once
                    feats = torch.split(self.supernet.features(self.finetune, path), self.sizes)
                for step in range(self.steps):
                    i = step % len(feats)
                    opt.zero_grad(set_to_none=True)
                    self.loss_fn(functional_call(head, params, (feats[i],)), self.labels[i]).backward()
                    opt.step()
            acc = MetricAccumulator()
            with torch.no_grad():
                acc.update(functional_call(head, params, (self.supernet.features(self.val, path),)), self.val.labels)
        finally:
            self.supernet.train(was_training)
        return {k: float(v) for k, v in acc.compute().items()}


def make_scorer(supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: OneShotConfig) -> ChildScorer:
    """A scorer on ``finetune_batches`` shuffled training batches and the first ``score_batches`` validation ones."""
    stream = batches(data.split("train"), train_cfg.batch_size, train_cfg.seed + 7)
    finetune = [next(stream) for _ in range(cfg.finetune_batches)]
    val_it = data.split("val").batches(train_cfg.batch_size, shuffle=False)
    val = [b for _, b in zip(range(cfg.score_batches), val_it)]
    return ChildScorer(supernet, finetune, val, train_cfg.lr_dense, cfg.finetune_steps)


def score(supernet: Supernet, scorer: ChildScorer, arch: Architecture) -> TrialResult:
    """``arch`` scored on inherited weights (:class:`ChildScorer`); a non-finite NE is a failure."""
    path = supernet.as_path(arch)
    metrics, mflops = scorer(path), supernet.path_flops(path) / 1e6
    return (TrialResult(val_ne=metrics["ne"], mflops=mflops) if math.isfinite(metrics["ne"])
            else TrialResult.failure(f"inherited NE is {metrics['ne']}", mflops=mflops))


__all__ = ["ChildScorer", "make_scorer", "oneshot_schedule", "score", "train_supernet", "widest_probability"]
