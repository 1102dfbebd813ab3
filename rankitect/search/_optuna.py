"""Optuna plumbing shared by the strategies: lazy import, studies, and in-memory study snapshots.

Optuna is imported only here and only when a strategy needs it (the CLI starts faster).

Any number of processes may start at once on a fresh RDB storage. Optuna creates its tables (and,
on PostgreSQL, its enum types) on first use without guarding against a second process doing the
same ("table studies already exists", a duplicate ``studydirection`` type), so every process
creates or loads the study under :func:`storage_lock`: a file lock beside a SQLite database, a
session-level advisory lock on a PostgreSQL server. A process that waits for the lock finds the
tables made and only loads them.
"""

from __future__ import annotations

import fcntl
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
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


def release_running(storage: str, study_name: str | None, hashes: list[str], why: str) -> None:
    """Fail the running trials of ``hashes`` (a stopped process's) as :data:`STOPPED_ATTR`, so they
    hold no slot of the shared budget and a resumed search may propose them again."""
    optuna = import_optuna()
    study = load_shared_study(storage, study_name)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if counts(t) and t.user_attrs[HASH_ATTR] in hashes:
            optuna.trial.Trial(study, t._trial_id).set_user_attr(STOPPED_ATTR, why)
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)


def takes_budget(trial: Any) -> bool:
    """Whether ``trial`` holds one of a shared search's ``search.trials`` slots: a proposal of its
    own (:func:`counts`), neither a baseline nor pruned (a pruned trial gives its slot back)."""
    return counts(trial) and BASELINE_ATTR not in trial.user_attrs and trial.state.name != "PRUNED"


def claim_budget(storage: str, study_name: str | None, genotype_hash: str, budget: int) -> bool:
    """Whether the running proposal of ``genotype_hash`` is within a shared study's ``budget``.

    Processes check the budget before they propose, so two may propose the last trial at once;
    the earlier proposals (by trial number) keep the budget, and a proposal past it is marked
    :data:`OVER_BUDGET_ATTR` and failed, and is never trained.
    """
    optuna = import_optuna()
    study = load_shared_study(storage, study_name)
    trials = study.get_trials(deepcopy=False)
    running = optuna.trial.TrialState.RUNNING
    mine = [t for t in trials if counts(t) and t.user_attrs[HASH_ATTR] == genotype_hash and t.state == running]
    if not mine:
        return True
    number = mine[-1].number
    if sum(1 for t in trials if takes_budget(t) and t.number < number) < budget:
        return True
    optuna.trial.Trial(study, mine[-1]._trial_id).set_user_attr(OVER_BUDGET_ATTR, True)
    study.tell(number, state=optuna.trial.TrialState.FAIL)
    return False


SQLITE_BUSY_TIMEOUT_S = 120  # a writer waits this long for another's transaction (busy machines)
ADVISORY_LOCK_KEY = zlib.crc32(b"rankitect.storage")  # one PostgreSQL lock for every rankitect process


@contextmanager
def storage_lock(storage: str) -> Iterator[None]:
    """Exclusive among the processes using the RDB URL ``storage`` (blocks until it is free).

    SQLite: ``flock`` on ``<database>.lock`` (the processes of one machine, which is where a
    SQLite file can be shared). PostgreSQL: ``pg_advisory_lock`` held by a connection of its own,
    released when the block ends or the process dies. Other databases: no lock.
    """
    from sqlalchemy.engine import make_url

    url = make_url(storage)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        lock = Path(url.database).expanduser().resolve().with_name(Path(url.database).name + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    elif url.get_backend_name() == "postgresql":
        yield from _advisory_lock(storage)
    else:
        yield


def proposal_lock(storage: str | None) -> Any:
    """:func:`storage_lock` around recording a proposal in a shared study (no lock in memory).

    Optuna numbers a trial when it is created and its genotype attribute is set after, so two
    processes proposing one genotype at once could each miss the other's; under the lock a
    proposal is recorded with its genotype and checked against the others in one step.
    """
    return storage_lock(storage) if storage is not None else nullcontext()


def _advisory_lock(storage: str) -> Iterator[None]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(storage, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()


def rdb_storage(storage: str) -> Any:
    """Optuna's storage for the RDB URL ``storage``; SQLite writers wait for each other (up to
    :data:`SQLITE_BUSY_TIMEOUT_S`) instead of failing with "database is locked"."""
    optuna = import_optuna()
    kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if storage.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(storage, engine_kwargs=kwargs)


def load_shared_study(storage: str, study_name: str | None) -> Any:
    """The existing study ``study_name`` of ``storage`` (``KeyError`` if there is none)."""
    return import_optuna().load_study(study_name=study_name, storage=rdb_storage(storage))


def import_optuna() -> Any:
    """``optuna``, with its per-trial INFO logging silenced."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(space: Space) -> dict[str, Any]:
    """One categorical distribution per labelled choice of ``space``."""
    optuna = import_optuna()
    return {label: optuna.distributions.CategoricalDistribution(c.options) for label, c in space.choices.items()}


def open_study(storage: str | Any | None, study_name: str | None, directions: list[str]) -> optuna.Study:
    """A new in-memory study (``storage=None``) or the named study of an RDB URL (or of an Optuna
    storage object, e.g. a journal file), created if new.

    Several processes opening one ``storage``/``study_name`` share its trials, and may start at
    the same moment (see :func:`storage_lock`). An existing study with other directions is refused.
    """
    optuna = import_optuna()
    if storage is None:
        return optuna.create_study(directions=directions, study_name=study_name)
    if not study_name:
        raise ValueError(f"storage {storage!r} needs a study_name so that processes can share the study")
    if isinstance(storage, str):
        with storage_lock(storage):
            study = optuna.create_study(storage=rdb_storage(storage), study_name=study_name, directions=directions,
                                        load_if_exists=True)
    else:  # a storage object guards its own creation (a journal file appends under its lock)
        study = optuna.create_study(storage=storage, study_name=study_name, directions=directions, load_if_exists=True)
    have = [d.name.lower() for d in study.directions]
    if have != directions:
        raise ValueError(f"study {study_name!r} in {storage!r} has directions {have}, this strategy needs {directions}")
    return study


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
