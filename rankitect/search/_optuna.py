"""Optuna plumbing shared by the strategies: lazy import, studies, and in-memory study snapshots.

Optuna is imported only here and only when a strategy needs it (the CLI starts faster). What
processes sharing one storage need (locks, the shared study, the trial budget across processes)
is :mod:`rankitect.search.running.shared_study`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from rankitect.search.base import Space

# Trial user attributes every rankitect trial carries (the genotype is found again by its flat
# sample, which are the trial's params, decoded by the space).
HASH_ATTR = "genotype_hash"
GENOTYPE_ATTR = "genotype"
DUPLICATE_ATTR = "duplicate_of"
OVER_BUDGET_ATTR = "over_budget"  # proposed after a shared search's trials were all taken: never run
BASELINE_ATTR = "baseline"  # a hand-built model trained before the search: known, but no trial of the budget
STOPPED_ATTR = "stopped"  # running when its process was stopped by a signal: free to be proposed again
NOT_COUNTED = (DUPLICATE_ATTR, OVER_BUDGET_ATTR, STOPPED_ATTR)


def counts(trial: Any) -> bool:
    """Whether ``trial`` is a proposal of its own: a genotype, not a duplicate, not over budget,
    not stopped half-way."""
    attrs = trial.user_attrs
    return HASH_ATTR in attrs and not any(a in attrs for a in NOT_COUNTED)


def import_optuna() -> Any:
    """``optuna``, with its per-trial INFO logging silenced."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(space: Space) -> dict[str, Any]:
    """One categorical distribution per labelled choice of ``space``."""
    optuna = import_optuna()
    return {label: optuna.distributions.CategoricalDistribution(c.options) for label, c in space.choices.items()}


def open_study(storage: Any | None, study_name: str | None, directions: list[str]) -> optuna.Study:
    """A new in-memory study (``storage=None``) or the named study of an Optuna storage object
    (a journal file, an RDB storage), created if new. An existing study with other directions is
    refused. A study shared by processes through an RDB URL is opened by
    :meth:`rankitect.search.running.shared_study.SharedStudy.open`, under the storage's lock.
    """
    optuna = import_optuna()
    if storage is None:
        return optuna.create_study(directions=directions, study_name=study_name)
    if not study_name:
        raise ValueError(f"storage {storage!r} needs a study_name so that processes can share the study")
    study = optuna.create_study(storage=storage, study_name=study_name, directions=directions, load_if_exists=True)
    check_directions(study, directions)
    return study


def check_directions(study: optuna.Study, directions: list[str]) -> None:
    have = [d.name.lower() for d in study.directions]
    if have != directions:
        raise ValueError(f"study {study.study_name!r} has directions {have}, this strategy needs {directions}")


def fixed_sampler(sample: dict[str, Any]) -> Any:
    """A sampler whose trial takes exactly the params ``sample`` (to record a known architecture)."""
    optuna = import_optuna()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(sample, optuna.samplers.RandomSampler(seed=0))


def record_trial(study: optuna.Study, space: Space, sample: dict[str, Any], attrs: dict[str, Any]) -> optuna.Trial:
    """Start a RUNNING trial with params ``sample`` and user ``attrs``; returns it."""
    study.sampler = fixed_sampler(sample)
    trial = study.ask()
    for label, choice in space.choices.items():
        trial.suggest_categorical(label, choice.options)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return trial


def snapshot(study: optuna.Study) -> dict[str, Any]:
    """The trials (running ones included) and system attributes of an in-memory study, as JSON data."""
    trials = [
        {
            "state": t.state.name, "params": t.params, "values": t.values,
            "user_attrs": t.user_attrs, "system_attrs": t.system_attrs,
        }
        for t in study.get_trials(deepcopy=False)
    ]
    # Optuna keeps e.g. NSGA-II's parent populations here; there is no public getter.
    system = study._storage.get_study_system_attrs(study._study_id)
    return {"trials": trials, "system_attrs": system}


def restore(study: optuna.Study, space: Space, snap: dict[str, Any]) -> None:
    """Replay :func:`snapshot` into a fresh in-memory ``study`` (trial numbers and ids match).

    Trial ids are used by NSGA-II's cached parent populations; a fresh in-memory storage numbers
    them 0, 1, ... like the study it was taken from, which is the only study of its storage.
    """
    optuna = import_optuna()
    if study.get_trials(deepcopy=False):
        raise ValueError("restore needs an empty study")
    dists = distributions(space)
    for t in snap["trials"]:
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState[t["state"]], params=t["params"],
            distributions={k: dists[k] for k in t["params"]}, values=t["values"],
            user_attrs=t["user_attrs"], system_attrs=t["system_attrs"],
        ))
    for key, value in snap["system_attrs"].items():
        study._storage.set_study_system_attr(study._study_id, key, value)
