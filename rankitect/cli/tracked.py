"""What commands on a tracked run share: opening the run store, and the data a run was trained on."""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.config import Config, DataConfig, config_from_dict

from rankitect.config_rules import flatten, to_dict
from rankitect.errors import UserError

# Data settings that decide what a model sees (``cache_dir`` only says where the cache lives).
DATA_KEYS = tuple(k for k in DataConfig.__dataclass_fields__ if k != "cache_dir")


def open_tracker(cfg: Config) -> Any:
    """The tracker of ``cfg.track``; a SQLite store that does not exist is an error naming it
    (reading commands never create an empty store)."""
    from rankitect.track import Tracker, resolve_uri
    from rankitect.track.location import store_exists

    uri = resolve_uri(cfg.track.uri)
    if not store_exists(uri):
        raise UserError(f"no run store at {uri} (name one with track.uri=... or $MLFLOW_TRACKING_URI)")
    return Tracker(uri, cfg.track.experiment)


def data_params(cfg: Config) -> dict[str, str]:
    """The data settings of ``cfg`` as the run parameters ``data.*`` (what finetune and probe read back)."""
    return {f"data.{k}": str(v) for k, v in flatten(to_dict(cfg.data)).items()}


def logged_data_config(tracker: Any, run_id: str) -> tuple[DataConfig | None, str]:
    """The data settings logged on ``run_id`` or, for a candidate, on its search; ``None`` when the
    run predates their logging. Also returns the id of the run that holds them."""
    logged, holder = tracker.logged_settings(run_id, "data")
    if not logged:
        return None, holder
    raw = {k: None if v == "None" else v for k, v in logged.items() if k in DataConfig.__dataclass_fields__}
    overrides = [f"data.{k}={'' if v is None else v}" for k, v in raw.items()]
    return config_from_dict({}, overrides).data, holder


def data_of_run(args: argparse.Namespace, cfg: Config, tracker: Any, run_id: str, what: str) -> DataConfig:
    """The data a command on ``run_id`` uses: the settings logged on the run. A ``data.*`` setting
    given on the command line (or in ``-c FILE``) that differs is an error naming both values."""
    logged, holder = logged_data_config(tracker, run_id)
    if logged is None:
        print(f"note: run {run_id} logged no data settings; using data.source={cfg.data.source}")
        return cfg.data
    explicit = getattr(args, "explicit", set())
    for key in DATA_KEYS:
        given, used = getattr(cfg.data, key), getattr(logged, key)
        if f"data.{key}" in explicit and given != used:
            raise UserError(f"{what} {run_id}: data.{key}={given} was given, but run {holder} was trained "
                            f"with data.{key}={used} (leave data.{key} out to use the run's data)")
    cache_dir = cfg.data.cache_dir if "data.cache_dir" in explicit else logged.cache_dir
    return DataConfig(**{**{k: getattr(logged, k) for k in DATA_KEYS}, "cache_dir": cache_dir})
