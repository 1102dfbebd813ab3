"""The result of one trial: what training and scoring one architecture gave, or why it failed.

Every strategy learns from it (``tell``), the runner records it (checkpoint, MLflow child run) and
the objective ranks it (:class:`~rankitect.eval.objective.Objective`). It is plain data, below
``search``, so that the objective, the tracker and the supernet phases read it without importing
the search:

>>> TrialResult(val_ne=0.80, test_ne=0.81, mflops=1.5).ok
True
>>> TrialResult.failure("loss is NaN at step 40").status
'failed'
>>> TrialResult.from_dict(TrialResult(val_ne=0.8, mflops=1.5).to_dict()) == TrialResult(val_ne=0.8, mflops=1.5)
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankitect.space.flops import Cost

STATUSES = ("ok", "failed", "pruned")


@dataclass(frozen=True)
class TrialResult:
    """The outcome of training and scoring one architecture.

    Args:
        status: ``"ok"``, ``"failed"`` (diverged, crashed, out of memory ...) or ``"pruned"``
            (stopped early by the search's successive halving; its budget slot is given back).
        val_ne: NE on the validation split (of the best validation); what strategies rank by.
            Required when ok; a pruned trial's is the best before it was stopped.
        test_ne, test_auc, test_logloss: held-out metrics, reported only.
        mflops: forward MFLOPs per example as served (``cost.served_mflops``). Required when ok.
        params: number of model parameters.
        cost: the candidate's :class:`~rankitect.space.flops.Cost` (plain and ROCS FLOPs, parameters),
            measured once before training; ``None`` when it was never built.
        train_seconds: wall time of training.
        error: why a failed trial failed.
        steps: training steps taken; best_step: the step of the best validation (an ok trial's).
        stopped: why training ended early though the trial is ok (``"time budget"``: the search's
            deadline; its best validation so far is its result), ``None`` when it ran to its end.
        held_out_seconds: the seconds its scoring on the rows a search holds out for its verdict
            took (what the verdict costs; never the score itself), ``None`` without such rows.
    """

    status: str = "ok"
    val_ne: float | None = None
    test_ne: float | None = None
    test_auc: float | None = None
    test_logloss: float | None = None
    mflops: float | None = None
    params: int | None = None
    train_seconds: float | None = None
    error: str | None = None
    steps: int | None = None  # training steps taken
    cost: Cost | None = None
    best_step: int | None = None  # the step of the best validation
    stopped: str | None = None  # e.g. "time budget": cut short by the search's deadline
    held_out_seconds: float | None = None  # of its wall time, the scoring on the verdict's held-out rows

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"TrialResult status must be one of {STATUSES}, got {self.status!r}")
        if self.ok:
            for name in ("val_ne", "mflops"):
                value = getattr(self, name)
                if value is None or not math.isfinite(value):
                    raise ValueError(f"an ok TrialResult needs a finite {name}, got {value!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failure(
        cls, error: str, *, mflops: float | None = None, params: int | None = None,
        train_seconds: float | None = None, cost: Cost | None = None,
    ) -> TrialResult:
        """A failed trial with its error message (and whatever was known before it failed)."""
        return cls(status="failed", error=error, mflops=mflops, params=params, train_seconds=train_seconds, cost=cost)

    @property
    def pruned(self) -> bool:
        return self.status == "pruned"

    @classmethod
    def pruning(
        cls, error: str, *, val_ne: float | None, mflops: float | None, params: int | None,
        train_seconds: float | None, steps: int | None, cost: Cost | None = None,
    ) -> TrialResult:
        """A pruned trial: why, its best validation NE so far and what it cost."""
        val_ne = val_ne if val_ne is not None and math.isfinite(val_ne) else None
        return cls(status="pruned", error=error, val_ne=val_ne, mflops=mflops, params=params,
                   train_seconds=train_seconds, steps=steps, cost=cost)

    @classmethod
    def from_metrics(
        cls, metrics: dict[str, float], *, mflops: float, params: int | None = None,
        train_seconds: float | None = None, steps: int | None = None, cost: Cost | None = None,
        best_step: int | None = None, stopped: str | None = None, held_out_seconds: float | None = None,
    ) -> TrialResult:
        """From the ``val/*``, ``test/*`` metrics dict of ``rankitect.train.loop.train_model``."""
        return cls(
            val_ne=metrics["val/ne"], test_ne=metrics.get("test/ne"), test_auc=metrics.get("test/auc"),
            test_logloss=metrics.get("test/logloss"), mflops=mflops, params=params,
            train_seconds=train_seconds, steps=steps, cost=cost, best_step=best_step, stopped=stopped,
            held_out_seconds=held_out_seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrialResult keys {unknown}; known: {sorted(known)}")
        if isinstance(d.get("cost"), dict):
            from rankitect.space.flops import Cost

            d = {**d, "cost": Cost(**d["cost"])}
        return cls(**d)


__all__ = ["STATUSES", "TrialResult"]
