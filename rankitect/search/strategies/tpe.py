"""``tpe``: Optuna's tree-structured Parzen estimator on the search objective (one value: NE with
the FLOPs penalty), through :class:`~rankitect.search.strategies.optuna.OptunaStrategy`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import rankitect.search._optuna as _optuna
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Space, register_strategy
from rankitect.search.running.shared_study import SharedStudy
from rankitect.search.strategies.optuna import OptunaStrategy


@register_strategy("tpe")
class TPESearch(OptunaStrategy):
    """Tree-structured Parzen estimator (Bergstra et al. 2011) on the objective (NE + FLOPs penalty).

    Args:
        n_startup_trials: uniform trials before the density model takes over.
        multivariate: model the choices jointly (Falkner et al. 2018) instead of one by one.
        shared, max_retries: see :class:`OptunaStrategy`.
    """

    directions: ClassVar[list[str]] = ["minimize"]

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, n_startup_trials: int = 10,
        multivariate: bool = False, shared: SharedStudy | None = None, max_retries: int = 100,
    ) -> None:
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must be >= 0, got {n_startup_trials}")
        self.n_startup_trials, self.multivariate = n_startup_trials, multivariate
        super().__init__(space, seed=seed, objective=objective, shared=shared, max_retries=max_retries)

    def make_sampler(self, seed: int) -> Any:
        optuna = _optuna.import_optuna()
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup_trials,
                                          multivariate=self.multivariate, constant_liar=True)

    def values(self, result: TrialResult) -> list[float]:
        return [self.objective(result)]
