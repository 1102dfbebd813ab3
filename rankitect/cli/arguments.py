"""How a command reads its line: ``-c FILE`` and ``key=value`` overrides, flags as overrides, and
the genotype a ``--arch`` names.

Shared by every command module of :mod:`rankitect.cli`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from rankitect.config import Config
from rankitect.errors import UserError

# A config override: a dotted key (``data.rows``), then ``=``. Told apart from positional arguments
# (run ids, files) before argparse sees the line, so an override may stand anywhere.
OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+=")
VERBOSE = ("-v", "--verbose")


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.steps=200")


def flag_overrides(args: argparse.Namespace, mapping: dict[str, str]) -> list[str]:
    """Turn the flags that were given into ``key=value`` overrides (flags win over the file)."""
    out = []
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
    return out


def explicit_keys(path: str | None, overrides: list[str]) -> set[str]:
    """The dotted config keys a user set (in ``-c FILE`` or as overrides), not left at their default.

    A key given twice on the line (two overrides, or a flag and an override) is a ``ConfigError``
    naming it and both values: a script that appends overrides would otherwise lose one unseen.

    >>> sorted(explicit_keys(None, ["data.rows=2000", "search.trials=8"]))
    ['data.rows', 'search.trials']
    >>> explicit_keys(None, ["data.rows=0", "search.trials=8", "data.rows=2000"])
    Traceback (most recent call last):
    ...
    rankitect.errors.ConfigError: config key 'data.rows' given twice: data.rows=0 and data.rows=2000
    """
    from rankitect.config import _read_yaml
    from rankitect.config_rules import flatten
    from rankitect.errors import ConfigError

    given: dict[str, str] = {}
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.strip()
        if key in given:
            raise ConfigError(f"config key {key!r} given twice: {key}={given[key]} and {key}={value}")
        given[key] = value
    return set(given) | (set(flatten(_read_yaml(path))) if path else set())


def set_threads(cfg: Config) -> None:
    """Apply ``runtime.threads`` (0: torch's default) to this process."""
    if cfg.runtime.threads > 0:
        import torch

        torch.set_num_threads(cfg.runtime.threads)


def is_genotype_ref(target: str) -> bool:
    """Whether ``target`` names a genotype (``baseline:NAME`` or a JSON file) rather than a run id."""
    return target.startswith("baseline:") or target.endswith(".json") or Path(target).is_file()


def load_arch(ref: str, spec: Any, cfg: Config | None = None) -> Any:
    """The ``Architecture`` that ``--arch ref`` names: ``baseline:NAME`` or a genotype JSON file
    (read within the genotype size and depth limits), priced on ``spec`` before anything is built
    and refused above ``runtime.memory_budget`` for ``train.batch_size`` rows a step (``cfg``'s,
    else the defaults)."""
    from rankitect.space.architecture import read_genotype
    from rankitect.space.pricing import check_fits

    cfg = cfg or Config()
    if ref.startswith("baseline:"):
        from rankitect.space.baselines import BASELINES, HISTORY_BASELINES, get_baseline

        name = ref.split(":", 1)[1]
        known = {**BASELINES, **HISTORY_BASELINES}
        if name not in known:
            raise UserError(f"--arch {ref}: unknown baseline {name!r}; known: {sorted(known)}")
        try:
            arch = get_baseline(name, spec)
        except ValueError as err:  # din or bst on data without a history
            raise UserError(f"--arch {ref}: {err}") from None
        check_fits(arch, spec, cfg.runtime.memory_budget, cfg.train.batch_size, where=f"--arch {ref}: ")
        return arch
    path = Path(ref)
    if not path.is_file():
        raise UserError(f"--arch {ref}: no such file (give a genotype JSON or baseline:NAME)")
    arch = read_genotype(path)
    try:
        # Priced on the meta device: an unknown activation or a size that does not fit the data is
        # refused here, and so is a model above the budget, before one weight is allocated.
        check_fits(arch, spec, cfg.runtime.memory_budget, cfg.train.batch_size, where=f"{path}: ")
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path}: not a valid genotype: {e}") from None
    return arch
