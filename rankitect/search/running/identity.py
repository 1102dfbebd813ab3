"""A search's identity: what makes its results comparable with each other.

A search ranks candidates against baselines and each other; that is fair only if every one of them
was trained on the same data, drawn from the same space by the same strategy and judged by the same
objective and training protocol. The parent run records this identity (in its checkpoint, as
``identity.json`` on the run, and in a shared study), and a ``--resume`` or a process joining a
shared search compares its own with it: a difference is refused (a :class:`UserError` naming the
key and both values), never silently mixed in.

The identity is the whole config but :data:`MAY_CHANGE` (how much to run and where, not what), plus
a description of the data as it was read: its source kind, rows and clicks per split, a digest of
its feature spec (vocabularies, each dense column's training statistics) and, for the synthetic
generator, its cache key (its parameters). A file's data is compared by what was read, not by its
path or cache key (which holds the file's path and mtime), so processes on several machines may
read their own copies of one file.

>>> from rankitect.config import load_config
>>> a = config_identity(load_config())
>>> b = config_identity(load_config(overrides=["search.trials=40", "search.strategy=tpe"]))
>>> first_difference(b, a)
('search.strategy', 'tpe', 'evolution')
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rankitect.config import Config, config_from_dict

from rankitect.config_rules import flatten, rename_old_keys, to_dict

# Config keys that a resumed search, or a process joining a shared search, may set otherwise: how
# long and how wide the search runs, where it writes and on what hardware; none of them changes
# how a trial is trained or ranked. A key ending in "." stands for its whole section. The data
# section is compared by the data set read (see data_identity), except for the synthetic
# generator's own parameters.
MAY_CHANGE: tuple[str, ...] = (
    "search.trials", "search.time_budget", "search.workers", "search.seed", "search.keep_top_k",
    "search.reuse_baselines",
    "search.storage", "search.study_name", "search.output_dir",
    "search.oneshot.supernet.top_k", "search.dnas.supernet.top_k",
    "search.oneshot.supernet.log_every", "search.dnas.supernet.log_every",
    "train.progress", "runtime.", "track.", "data.",
)
SYNTHETIC_KEYS = ("data.source", "data.rows", "data.seed", "data.ctr")  # the generator's parameters (synthetic data)


def may_change(key: str) -> bool:
    """Whether config key ``key`` may differ between a search and its resume or another process."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE)


def config_identity(cfg: Config) -> dict[str, Any]:
    """The config keys that make results comparable, flattened (``{"search.space": "engineer", ...}``)."""
    flat = flatten(to_dict(cfg))
    keys = [k for k in flat if not may_change(k)]
    if cfg.data.source == "synthetic":
        keys = list(SYNTHETIC_KEYS) + keys
    return _plain({k: flat[k] for k in keys})


def data_identity(data: Any) -> dict[str, Any]:
    """The data set as read (a :class:`~rankitect.data.ClickData`): source kind, cache key (synthetic
    data), rows and clicks per split, and a digest of the feature spec."""
    meta = data.meta
    splits = ", ".join(f"{name} {s['rows']} rows {s['positives']} clicks" for name, s in meta["splits"].items())
    spec = json.dumps(data.spec.to_dict(), sort_keys=True, default=str)
    kind = str(meta.get("source", "?"))
    # A file's cache key holds its path and mtime: a copy of the same rows elsewhere is the same data.
    key = {"data.cache_key": meta.get("cache_key")} if kind == "synthetic" else {}
    digest = hashlib.sha256(spec.encode()).hexdigest()[:16]
    return {"data.kind": kind, **key, "data.splits": splits, "data.features": digest}


def search_identity(cfg: Config, data: Any) -> dict[str, Any]:
    """:func:`config_identity` and :func:`data_identity` in one mapping."""
    return {**config_identity(cfg), **data_identity(data)}


def first_difference(mine: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key (in ``theirs``' order, then ``mine``'s) whose values differ, with ``mine``'s and
    ``theirs``' value; None when they agree. A key one side lacks (an older checkpoint) is skipped."""
    for key in [*theirs, *(k for k in mine if k not in theirs)]:
        if key in mine and key in theirs and mine[key] != theirs[key]:
            return key, mine[key], theirs[key]
    return None


def refuse_difference(mine: dict[str, Any], theirs: dict[str, Any], what: str, here: str) -> None:
    """Raise a :class:`UserError` naming the first differing key and both values: ``what`` names the
    search (``--resume RUN``), ``here`` this side (``here``, ``in this process``)."""
    from rankitect.errors import UserError

    diff = first_difference(_plain(mine), _plain(theirs))
    if diff is None:
        return
    key, ours, recorded = diff
    changeable = ", ".join(k + "*" if k.endswith(".") else k for k in MAY_CHANGE)
    raise UserError(f"{what}: {key} is {ours!r} {here} but {recorded!r} in the search; its results would not "
                    f"be comparable (what may change: {changeable})")


def check_identity(mine: dict[str, Any], state: Any, shared: Any) -> None:
    """Refuse to resume ``state`` (a search checkpoint), or to join the search of ``shared`` (a
    shared study), with another identity than the search's."""
    if state is not None:
        # an older checkpoint: its config, keys renamed since moved over
        recorded = state.identity or config_identity(config_from_dict(rename_old_keys(state.config)))
        refuse_difference(mine, recorded, f"--resume {state.parent_run_id}", "here")
    elif shared is not None:
        recorded = shared.identity()
        if recorded is not None:
            refuse_difference(mine, recorded, f"study {shared.name!r} of {shared.storage}", "in this process")


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """JSON's view of ``d`` (tuples become lists), as a checkpoint or a study stores it."""
    return json.loads(json.dumps(d, default=str))
