"""rankitect.search: strategies that propose architectures, and the objective that ranks them.

``build_strategy(name, space, seed=..., objective=..., **options)`` with ``name`` one of
:data:`STRATEGIES`: ``random``, ``evolution``, ``tpe``, ``nsga2``. Optuna is imported only when a
strategy that needs it is built. The weight-sharing strategies ``oneshot`` and ``dnas`` are not
ask/tell strategies but runners of their own around a supernet
(:func:`rankitect.search.runner.runner_class`).
"""

from rankitect.search import evolution, optuna_search, random_search  # noqa: F401  (registers them)
from rankitect.search.base import (
    STRATEGIES,
    SpaceExhausted,
    Strategy,
    TrialResult,
    arch_hash,
    build_strategy,
    register_strategy,
)
from rankitect.search.objective import Objective

__all__ = [
    "STRATEGIES",
    "Objective",
    "SpaceExhausted",
    "Strategy",
    "TrialResult",
    "arch_hash",
    "build_strategy",
    "register_strategy",
]
