"""Scoring a model on a split: NE, logloss, AUC, calibration over many batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
from torch import nn

from rankitect.data.batch import Batch
from rankitect.eval.metrics import MetricAccumulator


@torch.no_grad()
def accumulate(model: nn.Module, batches: Iterable[Batch], max_batches: int = 0) -> MetricAccumulator:
    """The :class:`MetricAccumulator` of ``model``'s logits over ``batches`` (the first ``max_batches``
    of them when > 0): its metrics, and its per-example losses in the batches' order.

    The model is put in eval mode for the pass and restored afterwards.
    """
    was_training = model.training
    model.eval()
    acc = MetricAccumulator()
    try:
        it = itertools.islice(batches, max_batches) if max_batches > 0 else batches
        for batch in it:
            acc.update(model(batch), batch.labels)
    finally:
        model.train(was_training)
    if acc.count == 0:
        raise ValueError("evaluate: no batches to evaluate")
    return acc


def evaluate(model: nn.Module, batches: Iterable[Batch], max_batches: int = 0) -> dict[str, float]:
    """Metrics of ``model`` over ``batches`` (the first ``max_batches`` of them when > 0); see :func:`accumulate`."""
    return {k: float(v) for k, v in accumulate(model, batches, max_batches).compute().items()}
