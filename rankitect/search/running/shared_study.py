"""Coordination of the processes that share one search through an Optuna storage (``search.storage``).

Everything several processes agree on lives here, beside the runner, and nowhere in the strategies:

* the storage's lock (:func:`storage_lock`): a file lock beside a SQLite database, a session-level
  advisory lock on a PostgreSQL server. Any number of processes may start at once on a fresh RDB
  storage; Optuna creates its tables (and, on PostgreSQL, its enum types) on first use without
  guarding against a second process doing the same, so studies are created or loaded under it;
* the shared study (:class:`SharedStudy`): strategies are handed one and record their proposals in
  it (random and evolution through :class:`~rankitect.search.proposing.history.StudyHistory`, TPE and NSG-II
  directly), under its lock;
* the trial budget across processes (:func:`claim_budget`, :func:`shared_trial_count`), the trials
  of a stopped process given back (:func:`release_running`);
* the one parent run of a shared search and its identity (:meth:`SharedStudy.parent_run`: a process
  whose data, space, strategy or objective differ from the search's is refused), what the first
  process resolved from the baselines (:meth:`SharedStudy.publish_view`, :meth:`SharedStudy.view`:
  the ``auto`` target and first rung every process ranks and prunes by), and the finished trials
  every process's Pareto table reads (:meth:`SharedStudy.share`, :meth:`SharedStudy.trials`);
* the first process's heartbeat while it trains the baselines (:func:`owner_heartbeat`,
  :meth:`SharedStudy.silence`): a process waiting for the view gives up, saying how to go on, once
  the first one has been silent for :data:`OWNER_SILENT_S` (killed without ending the parent run).
"""

from __future__ import annotations

import fcntl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rankitect.search._optuna as _optuna

PARENT_ATTR = "mlflow_parent_run_id"
IDENTITY_ATTR = "rankitect.identity"  # what makes the search's results comparable (search.identity)
VIEW_ATTR = "rankitect.view"  # what the first process resolved from the baselines (search.baseline_phase)
SHARED_TRIAL_ATTR = "rankitect.trial."  # + trial name: a finished trial, in the shared study's user attrs
HEARTBEAT_ATTR = "rankitect.owner_beat"  # wall-clock seconds of the first process's last beat (baseline phase)
HEARTBEAT_S = 10.0  # the first process beats this often while it trains the baselines
OWNER_SILENT_S = 600.0  # silent this long: the first process is gone (a SQLite writer may wait 120 s to beat)


@dataclass(frozen=True)
class SharedStudy:
    """The study ``name`` of the RDB URL ``storage`` that the processes of one search share.

    >>> SharedStudy("sqlite:///search.db", "s").storage
    'sqlite:///search.db'
    """

    storage: str
    name: str | None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"storage {self.storage!r} needs a study_name so that processes can share the study")

    def lock(self) -> AbstractContextManager[None]:
        """Exclusive among the processes of this storage (see :func:`storage_lock`)."""
        return storage_lock(self.storage)

    def open(self, directions: list[str]) -> Any:
        """The study, created if new (under the lock); other directions than its own are refused."""
        optuna = _optuna.import_optuna()
        with self.lock():
            study = optuna.create_study(storage=rdb_storage(self.storage), study_name=self.name,
                                        directions=directions, load_if_exists=True)
        _optuna.check_directions(study, directions)
        return study

    def load(self) -> Any:
        """The existing study (``KeyError`` if there is none)."""
        return load_shared_study(self.storage, self.name)

    def parent_run(self, new_parent: Callable[[], str], identity: dict[str, Any] | None = None) -> tuple[str, bool]:
        """The shared parent run and whether this process opened it: the first process to look
        opens it (``new_parent()``) and records ``identity`` beside it; the lock makes "look, then
        open and publish" one step, so processes started together agree on one parent. A later
        process whose ``identity`` differs from the recorded one is refused (a ``UserError`` naming
        the key and both values), before it has opened or written anything."""
        from rankitect.search.running.identity import refuse_difference

        with self.lock():
            study = self.load()
            parent = study.user_attrs.get(PARENT_ATTR)
            if parent is not None:
                recorded = study.user_attrs.get(IDENTITY_ATTR)
                if identity is not None and recorded is not None:
                    where = f"study {self.name!r} of {self.storage} (search run {parent})"
                    refuse_difference(identity, recorded, where, "in this process")
                return parent, False
            parent = new_parent()
            study.set_user_attr(PARENT_ATTR, parent)
            if identity is not None:
                study.set_user_attr(IDENTITY_ATTR, identity)
        return parent, True

    def identity(self) -> dict[str, Any] | None:
        """The identity the search's first process recorded (None before there is one)."""
        with self.lock():  # a fresh storage's tables are created on first use
            try:
                return self.load().user_attrs.get(IDENTITY_ATTR)
            except KeyError:
                return None

    def publish_view(self, view: dict[str, Any]) -> None:
        """Record what the search resolved from its baselines, for every other process (see :meth:`view`)."""
        self.load().set_user_attr(VIEW_ATTR, view)

    def view(self) -> dict[str, Any] | None:
        """What :meth:`publish_view` recorded, or None while the baselines are still training."""
        return self.load().user_attrs.get(VIEW_ATTR)

    def beat(self) -> None:
        """Record that the first process is alive now (see :func:`owner_heartbeat`)."""
        self.load().set_user_attr(HEARTBEAT_ATTR, time.time())

    def silence(self) -> float | None:
        """Seconds since the first process's last beat; None when it never beat (a search started
        by an older rankitect, or one that has not begun its baselines)."""
        last = self.load().user_attrs.get(HEARTBEAT_ATTR)
        return None if last is None else max(0.0, time.time() - float(last))

    def share(self, entry: dict[str, Any]) -> None:
        """Publish a finished trial (``kind``, ``name``, ``arch``, ``result``) to every process."""
        self.load().set_user_attr(SHARED_TRIAL_ATTR + entry["name"], entry)

    def trials(self) -> list[dict[str, Any]]:
        """Every finished trial any process shared, by name."""
        attrs = self.load().user_attrs
        return [e for key, e in sorted(attrs.items()) if key.startswith(SHARED_TRIAL_ATTR)]

    def claim(self, genotype_hash: str, budget: int) -> bool:
        return claim_budget(self.storage, self.name, genotype_hash, budget)

    def release(self, hashes: list[str], why: str) -> None:
        release_running(self.storage, self.name, hashes, why)

    def count(self) -> tuple[int, int]:
        """``(slots, proposals)`` of :func:`shared_trial_count`."""
        return shared_trial_count(self.storage, self.name, with_pruned=True)


@contextmanager
def owner_heartbeat(shared: SharedStudy | None, every: float = HEARTBEAT_S) -> Iterator[None]:
    """Beat (:meth:`SharedStudy.beat`) at once and then every ``every`` seconds from a daemon thread
    until the block ends; nothing without shared storage. A beat the storage refuses (busy) is
    skipped: the next one tries again, and a waiting process only gives up after
    :data:`OWNER_SILENT_S` without any."""
    if shared is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                shared.beat()
            except Exception:  # a busy or briefly unreachable storage: the next beat tries again
                pass
            if stop.wait(every):
                return

    thread = threading.Thread(target=beat, name="rankitect-owner-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def proposal_lock(shared: SharedStudy | None) -> AbstractContextManager[None]:
    """The lock around recording a proposal in a shared study (none for a study in memory).

    Optuna numbers a trial when it is created and its genotype attribute is set after, so two
    processes proposing one genotype at once could each miss the other's; under the lock a
    proposal is recorded with its genotype and checked against the others in one step.
    """
    from contextlib import nullcontext

    return shared.lock() if shared is not None else nullcontext()


def shared_trial_count(storage: str, study_name: str | None, *, with_pruned: bool = False) -> Any:
    """Proposals recorded in a shared study by every process that hold a trial slot (duplicates of
    earlier ones, baselines and pruned trials excluded); ``with_pruned``: that and all proposals,
    pruned included (baselines still not)."""
    try:
        trials = load_shared_study(storage, study_name).get_trials(deepcopy=False)
    except KeyError:
        trials = []
    slots = sum(1 for t in trials if takes_budget(t))
    proposals = sum(1 for t in trials if _optuna.counts(t) and _optuna.BASELINE_ATTR not in t.user_attrs)
    return (slots, proposals) if with_pruned else slots


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
    optuna = _optuna.import_optuna()
    kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if storage.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(storage, engine_kwargs=kwargs)


def load_shared_study(storage: str, study_name: str | None) -> Any:
    """The existing study ``study_name`` of ``storage`` (``KeyError`` if there is none)."""
    return _optuna.import_optuna().load_study(study_name=study_name, storage=rdb_storage(storage))


def release_running(storage: str, study_name: str | None, hashes: list[str], why: str) -> None:
    """Fail the running trials of ``hashes`` (a stopped process's) as
    :data:`~rankitect.search._optuna.STOPPED_ATTR`, so they hold no slot of the shared budget and a
    resumed search may propose them again."""
    optuna = _optuna.import_optuna()
    study = load_shared_study(storage, study_name)
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for h in hashes:
        t = own_running(trials, h)
        if t is not None:
            optuna.trial.Trial(study, t._trial_id).set_user_attr(_optuna.STOPPED_ATTR, why)
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)


def own_running(trials: list[Any], genotype_hash: str) -> Any:
    """The running proposal of ``genotype_hash`` among ``trials`` that belongs to the process that
    proposed it (None when there is none): the earliest. Another process that proposed the same
    genotype a moment later holds a later trial until it marks it a duplicate and fails it; that
    trial is neither ours to judge nor to fail."""
    running = [t for t in trials if _optuna.counts(t) and t.user_attrs[_optuna.HASH_ATTR] == genotype_hash
               and t.state.name == "RUNNING"]
    return min(running, key=lambda t: t.number) if running else None


def takes_budget(trial: Any) -> bool:
    """Whether ``trial`` holds one of a shared search's ``search.trials`` slots: a proposal of its
    own (:func:`~rankitect.search._optuna.counts`), neither a baseline nor pruned (a pruned trial
    gives its slot back)."""
    return _optuna.counts(trial) and _optuna.BASELINE_ATTR not in trial.user_attrs and trial.state.name != "PRUNED"


def claim_budget(storage: str, study_name: str | None, genotype_hash: str, budget: int) -> bool:
    """Whether the running proposal of ``genotype_hash`` is within a shared study's ``budget``.

    Processes check the budget before they propose, so two may propose the last trial at once;
    the earlier proposals (by trial number) keep the budget, and a proposal past it is marked
    :data:`~rankitect.search._optuna.OVER_BUDGET_ATTR` and failed, and is never trained.

    The proposal is this process's own running trial of ``genotype_hash`` (:func:`own_running`).
    """
    optuna = _optuna.import_optuna()
    study = load_shared_study(storage, study_name)
    trials = study.get_trials(deepcopy=False)
    proposal = own_running(trials, genotype_hash)
    if proposal is None:
        return True
    number = proposal.number
    if sum(1 for t in trials if takes_budget(t) and t.number < number) < budget:
        return True
    optuna.trial.Trial(study, proposal._trial_id).set_user_attr(_optuna.OVER_BUDGET_ATTR, True)
    study.tell(number, state=optuna.trial.TrialState.FAIL)
    return False


