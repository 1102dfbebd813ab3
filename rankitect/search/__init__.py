"""rankitect.search: strategies that propose architectures, and the objective that ranks them.

``build_strategy(name, space, seed=..., objective=..., **options)`` with ``name`` one of
:data:`STRATEGIES`, the one registry: ``random``, ``evolution``, ``tpe``, ``nsga2``, and the
weight-sharing ``oneshot`` and ``dnas``, which train a supernet when the runner starts them
(:meth:`~rankitect.search.base.Strategy.start`) and then propose what it chose; each lives in
:mod:`rankitect.search.strategies`, the runtime that runs them beside it here. Every one is a
:class:`~rankitect.search.base.Proposer` run by the one loop of :class:`~rankitect.search.running.runner.SearchRunner`.
Optuna is imported only when a strategy that needs it is built.
"""

import rankitect.search.strategies  # noqa: F401  (registers every strategy)
from rankitect.search.base import (
    STRATEGIES,
    Proposer,
    SearchContext,
    SpaceExhausted,
    Strategy,
    arch_hash,
    build_strategy,
    register_strategy,
)

__all__ = [
    "STRATEGIES",
    "Proposer",
    "SearchContext",
    "SpaceExhausted",
    "Strategy",
    "arch_hash",
    "build_strategy",
    "register_strategy",
]
