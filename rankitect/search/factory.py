"""From the ``search`` section of the config to an objective and a strategy, in one place.

>>> from rankitect.config import load_config
>>> cfg = load_config(overrides=["search.target_mflops=2.0", "search.penalty=absolute"])
>>> objective_from_config(cfg.search)
Objective(target_mflops=2.0, penalty='absolute', weight=0.1)
>>> strategy_options_from_config(cfg.search)
{'population': 8, 'sample_size': 4}
"""

from __future__ import annotations

from typing import Any

from rankitect.config import SearchConfig
from rankitect.errors import ConfigError
from rankitect.search.base import STRATEGIES, Space, Strategy, build_strategy
from rankitect.search.objective import Objective


def objective_from_config(cfg: SearchConfig) -> Objective:
    return Objective(target_mflops=cfg.target_mflops, penalty=cfg.penalty, weight=cfg.penalty_weight)


# Strategies with a loop of their own around a supernet (see ``runner.runner_class``).
SUPERNET_STRATEGIES = ("dnas", "oneshot")


def check_names(cfg: SearchConfig) -> None:
    """Refuse an unknown strategy or space by name, listing every registered one (before any work)."""
    from rankitect.space import SPACES

    known = sorted([*STRATEGIES, *SUPERNET_STRATEGIES])
    if cfg.strategy not in known:
        raise ConfigError(f"config key 'search.strategy': unknown strategy {cfg.strategy!r}; known: {known}")
    if cfg.space not in SPACES:
        raise ConfigError(f"config key 'search.space': unknown space {cfg.space!r}; known: {sorted(SPACES)}")


def strategy_options_from_config(cfg: SearchConfig) -> dict[str, Any]:
    """The options of ``cfg.strategy`` that the config sets (shared storage only when given)."""
    check_names(cfg)
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(f"config key 'search.strategy': {cfg.strategy!r} has a loop of its own, not ask/tell")
    if cfg.storage is not None and not cfg.study_name:
        raise ConfigError(f"config key 'search.study_name': needed with search.storage={cfg.storage!r}, "
                          "so that the processes sharing the storage find one study")
    options: dict[str, Any] = {}
    if cfg.strategy == "evolution":
        options.update(population=cfg.evolution.population, sample_size=cfg.evolution.sample_size)
    if cfg.storage is not None:
        options.update(storage=cfg.storage, study_name=cfg.study_name)
    return options


def strategy_from_config(cfg: SearchConfig, space: Space) -> Strategy:
    """``build_strategy(cfg.strategy, space, seed=cfg.seed, objective=..., **options)``."""
    return build_strategy(cfg.strategy, space, seed=cfg.seed, objective=objective_from_config(cfg),
                          **strategy_options_from_config(cfg))
