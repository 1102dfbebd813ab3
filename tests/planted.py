"""Planted validation scores: what stand-ins for ``rankitect.train.protocol.accumulate`` return."""

from __future__ import annotations

import numpy as np


class Scored:
    """A :class:`~rankitect.eval.metrics.MetricAccumulator` stand-in with planted metrics; its
    per-example losses are all equal (their mean is the planted logloss), so any two planted
    models differ by a constant and paired standard errors are zero: the plain rule decides."""

    def __init__(self, ne: float, logloss: float, rows: int = 8) -> None:
        self.ne, self.logloss, self.rows = ne, logloss, rows

    def compute(self) -> dict[str, float]:
        return {"ne": self.ne, "logloss": self.logloss, "auc": 0.7, "calibration": 1.0}

    def example_losses(self) -> np.ndarray:
        return np.full(self.rows, self.logloss)
