"""From the ``search`` section of the config to an objective and a strategy, in one place.

>>> from rankitect.config import load_config
>>> cfg = load_config(overrides=["search.target_mflops=2.0", "search.penalty=absolute"])
>>> objective_from_config(cfg.search)
Objective(target_mflops=2.0, penalty='absolute', weight=0.01)
>>> objective_from_config(load_config().search)  # target "auto": none until the baselines are trained
Objective(target_mflops=None, penalty='relaxed', weight=0.01)
>>> sorted(strategy_options_from_config(cfg.search))
['population', 'sample_size', 'surrogate']
>>> section_of(cfg.search, "dnas").supernet.steps, section_of(cfg.search, "tpe")
(300, None)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rankitect.config import SearchConfig
from rankitect.errors import ConfigError
from rankitect.search.base import STRATEGIES, Space, Strategy, build_strategy, strategy_options
from rankitect.eval.objective import Objective


def objective_from_config(cfg: SearchConfig) -> Objective:
    """The objective of ``cfg``; ``target_mflops: auto`` (or ``cheapest``) has no target until
    :func:`~rankitect.search.judging.selection.auto_target`."""
    target = None if isinstance(cfg.target_mflops, str) else cfg.target_mflops
    return Objective(target_mflops=target, penalty=cfg.penalty, weight=cfg.penalty_weight)


def check_names(cfg: SearchConfig) -> None:
    """Refuse an unknown strategy, space or baseline by name, listing every registered one (before
    any work: no data is read and no run is created)."""
    from rankitect.space import SPACES
    from rankitect.space.baselines import BASELINES, HISTORY_BASELINES

    known = sorted(STRATEGIES)
    if cfg.strategy not in known:
        raise ConfigError(f"config key 'search.strategy': unknown strategy {cfg.strategy!r}; known: {known}")
    if cfg.space not in SPACES:
        raise ConfigError(f"config key 'search.space': unknown space {cfg.space!r}; known: {sorted(SPACES)}")
    known = {**BASELINES, **HISTORY_BASELINES}  # din and bst: for data with a history
    unknown = [name for name in cfg.baselines if name not in known]
    if unknown:
        raise ConfigError(f"config key 'search.baselines': unknown baseline {unknown[0]!r}; known: {sorted(known)}")


def section_of(cfg: SearchConfig, name: str) -> Any | None:
    """Strategy ``name``'s own section of ``search`` (``search.evolution``, ``search.oneshot``,
    ``search.dnas``: the section named like it), None for a strategy without one."""
    section = getattr(cfg, name, None) if name in {f.name for f in dataclasses.fields(cfg)} else None
    return section if dataclasses.is_dataclass(section) else None


def section_options(section: Any, accepted: dict[str, Any]) -> dict[str, Any]:
    """A strategy's section as its constructor takes it: whole as ``config`` where it has that
    keyword (a section with sections of its own), else one keyword per key."""
    if section is None:
        return {}
    if "config" in accepted:
        return {"config": section}
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def strategy_options_from_config(cfg: SearchConfig) -> dict[str, Any]:
    """The options of ``cfg.strategy`` that the config sets: its own section (:func:`section_of`),
    then the shared ones it accepts (shared storage only when given)."""
    check_names(cfg)
    if cfg.storage is not None and not cfg.study_name:
        raise ConfigError(f"config key 'search.study_name': needed with search.storage={cfg.storage!r}, "
                          "so that the processes sharing the storage find one study")
    accepted = strategy_options(cfg.strategy)
    options = section_options(section_of(cfg, cfg.strategy), accepted)
    if "rocs" in accepted:
        options["rocs"] = cfg.rocs
    if "surrogate" in accepted:
        options["surrogate"] = cfg.surrogate
    if "fill" in accepted:  # a supernet's choice first, then more until search.trials are trained (or time is up)
        options["fill"] = cfg.trials
    if cfg.storage is not None and "shared" in accepted:
        from rankitect.search.running.shared_study import SharedStudy

        options.update(shared=SharedStudy(cfg.storage, cfg.study_name))
    return options


def strategy_from_config(cfg: SearchConfig, space: Space) -> Strategy:
    """``build_strategy(cfg.strategy, space, seed=cfg.seed, objective=..., **options)``."""
    return build_strategy(cfg.strategy, space, seed=cfg.seed, objective=objective_from_config(cfg),
                          **strategy_options_from_config(cfg))
