"""``nsga2``: Optuna's NSGA-II on two objectives, validation NE and MFLOPs, through
:class:`~rankitect.search.strategies.optuna.OptunaStrategy`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import rankitect.search._optuna as _optuna
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Space, register_strategy
from rankitect.search.running.shared_study import SharedStudy
from rankitect.search.strategies.optuna import OptunaStrategy


@register_strategy("nsga2")
class NSGA2Search(OptunaStrategy):
    """NSGA-II (Deb et al. 2002) on two objectives, validation NE and MFLOPs, both minimized.

    The ``objective`` is not used for selection here (the Pareto front is the goal); it still
    ranks the final candidates.

    Args:
        population_size: individuals per generation (the first generation is uniform).
        shared, max_retries: see :class:`OptunaStrategy`.
    """

    directions: ClassVar[list[str]] = ["minimize", "minimize"]

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, population_size: int = 10,
        shared: SharedStudy | None = None, max_retries: int = 100,
    ) -> None:
        if population_size < 2:
            raise ValueError(f"population_size must be >= 2, got {population_size}")
        self.population_size = population_size
        super().__init__(space, seed=seed, objective=objective, shared=shared, max_retries=max_retries)

    def make_sampler(self, seed: int) -> Any:
        optuna = _optuna.import_optuna()
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=self.population_size)

    def values(self, result: TrialResult) -> list[float]:
        return [float(result.val_ne), float(result.mflops)]
