"""Ranking metrics: NE, logloss, calibration, AUC; one-shot and streaming.

Convention: the plain functions take **probabilities** (``ne``, ``logloss``, ``calibration``,
``auc``); the ``*_from_logits`` functions and :func:`ranking_metrics` / :class:`MetricAccumulator`
take **logits**. Everything is computed in float64. Probabilities are clamped to
``[EPS, 1 - EPS]`` before taking logs; from logits the loss is exact (``softplus(z) - y z``) and
needs no clamp.

* logloss ``= -mean(y log p + (1 - y) log(1 - p))`` (nats)
* NE ``= logloss / H(ctr)``, ``H(c) = -(c log c + (1 - c) log(1 - c))``, ``ctr`` the observed rate
  of the evaluated labels (He et al., ADKDD 2014). Undefined (NaN) when all labels are equal.
* calibration ``= mean(p) / ctr`` (1 is calibrated; NaN without positives)
* AUC: torchmetrics' binary AUROC (ties count one half); NaN when only one class is present.

>>> ne([0.25, 0.25, 0.25, 0.25], [1, 0, 0, 0])  # the base-rate predictor has NE 1
1.0
>>> ranking_metrics([0.0, 2.0], [0, 1])["auc"]
1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

EPS = 1e-7
ArrayLike = torch.Tensor | np.ndarray | Sequence[float]


def _f64(x: ArrayLike) -> torch.Tensor:
    """Any array-like as a flat float64 CPU tensor (detached)."""
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float64))
    return t.to(device="cpu", dtype=torch.float64).reshape(-1)


def _pair(pred: ArrayLike, labels: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    p, y = _f64(pred), _f64(labels)
    if p.shape != y.shape:
        raise ValueError(f"predictions have {p.numel()} values but labels have {y.numel()}")
    if p.numel() == 0:
        raise ValueError("no predictions to score (empty input)")
    return p, y


def entropy(ctr: float) -> float:
    """Binary entropy (nats) of a base rate; 0 at 0 and 1."""
    if ctr <= 0.0 or ctr >= 1.0:
        return 0.0
    return -(ctr * math.log(ctr) + (1 - ctr) * math.log1p(-ctr))


def _ne_of(logloss_value: float, ctr: float) -> float:
    h = entropy(ctr)
    return logloss_value / h if h > 0 else float("nan")


def logloss(probs: ArrayLike, labels: ArrayLike) -> float:
    """Mean binary cross-entropy of probabilities (clamped to ``[EPS, 1 - EPS]``)."""
    p, y = _pair(probs, labels)
    p = p.clamp(EPS, 1 - EPS)
    return float(-(y * torch.log(p) + (1 - y) * torch.log1p(-p)).mean())


def _losses(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example binary cross-entropy of logits, exact: ``softplus(z) - y z``."""
    return torch.nn.functional.softplus(z) - y * z


def logloss_from_logits(logits: ArrayLike, labels: ArrayLike) -> float:
    """Mean binary cross-entropy of logits, exact: ``softplus(z) - y z``."""
    z, y = _pair(logits, labels)
    return float(_losses(z, y).mean())


def ne(probs: ArrayLike, labels: ArrayLike) -> float:
    """Normalized entropy of probabilities: logloss over the entropy of the observed CTR."""
    return _ne_of(logloss(probs, labels), float(_f64(labels).mean()))


def ne_from_logits(logits: ArrayLike, labels: ArrayLike) -> float:
    """Normalized entropy of logits."""
    return _ne_of(logloss_from_logits(logits, labels), float(_f64(labels).mean()))


def calibration(probs: ArrayLike, labels: ArrayLike) -> float:
    """Mean predicted probability over observed CTR (NaN when there are no positives)."""
    p, y = _pair(probs, labels)
    ctr = float(y.mean())
    return float(p.mean()) / ctr if ctr > 0 else float("nan")


def auc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve; any monotone score works (probabilities or logits)."""
    s, y = _pair(scores, labels)
    n_pos = int((y > 0.5).sum())
    if n_pos == 0 or n_pos == y.numel():
        return float("nan")
    return float(binary_auroc(s, (y > 0.5).long()))


def ranking_metrics(logits: ArrayLike, labels: ArrayLike) -> dict[str, float]:
    """``ne``, ``logloss``, ``auc``, ``calibration`` and ``ctr`` of logits against labels."""
    z, y = _pair(logits, labels)
    ll = logloss_from_logits(z, y)
    ctr = float(y.mean())
    return {"ne": _ne_of(ll, ctr), "logloss": ll, "auc": auc(z, y),
            "calibration": calibration(torch.sigmoid(z), y), "ctr": ctr}


class MetricAccumulator:
    """Streaming :func:`ranking_metrics` over many batches.

    NE, logloss, calibration and CTR are exact running sums (float64). AUC needs every score:
    they are kept (float32, on CPU) unless ``auc=False``, in which case ``auc`` is NaN.

    >>> acc = MetricAccumulator()
    >>> acc.update(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))
    >>> acc.update(torch.tensor([-1.0]), torch.tensor([0.0]))
    >>> m = acc.compute()
    >>> abs(m["logloss"] - ranking_metrics([0.0, 1.0, -1.0], [0, 1, 0])["logloss"]) < 1e-12, acc.count
    (True, 3)
    """

    def __init__(self, *, auc: bool = True) -> None:
        self.keep_scores = auc
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.loss_sum = 0.0
        self.label_sum = 0.0
        self.prob_sum = 0.0
        self._scores: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch: ``logits (B,)`` (or ``(B, 1)``) and ``labels (B,)``."""
        z, y = _pair(logits, labels)
        self.count += z.numel()
        self.loss_sum += float(_losses(z, y).sum())
        self.label_sum += float(y.sum())
        self.prob_sum += float(torch.sigmoid(z).sum())
        if self.keep_scores:
            self._scores.append(z.float())
            self._labels.append(y.float())

    def example_losses(self) -> np.ndarray:
        """The logloss of every example added since the last :meth:`reset`, in order (float64 array;
        needs the kept scores, so not with ``auc=False``). Their mean is ``compute()["logloss"]``."""
        if not self.keep_scores:
            raise ValueError("MetricAccumulator.example_losses needs the scores: built with auc=False")
        if self.count == 0:
            return np.zeros(0)
        return _losses(torch.cat(self._scores).double(), torch.cat(self._labels).double()).numpy()

    def compute(self) -> dict[str, float]:
        """The metrics of everything added since the last :meth:`reset`."""
        if self.count == 0:
            raise ValueError("MetricAccumulator.compute: no batches were added")
        ll, ctr = self.loss_sum / self.count, self.label_sum / self.count
        scores_auc = auc(torch.cat(self._scores), torch.cat(self._labels)) if self.keep_scores else float("nan")
        return {"ne": _ne_of(ll, ctr), "logloss": ll, "auc": scores_auc,
                "calibration": (self.prob_sum / self.count) / ctr if ctr > 0 else float("nan"), "ctr": ctr}
