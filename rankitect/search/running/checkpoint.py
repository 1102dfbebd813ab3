"""The search checkpoint: one JSON file, rewritten atomically after every finished trial.

It holds the config, the strategy's ``state_dict``, every finished trial (candidates and
baselines) with its genotype, result and MLflow child run id, and the *plan* of a weight-sharing
search (oneshot, dnas): the architectures its supernet phase chose for retraining, written as soon
as they are chosen, so a resumed search retrains the missing ones without training a supernet
again. A trial is written to the checkpoint *before* its child run is logged; on resume, trials
without a run id are logged then, so a kill at any moment neither loses a finished trial nor runs
or logs one twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankitect.errors import UserError
from rankitect.eval.result import TrialResult
from rankitect.space.architecture import Architecture

VERSION = 1


@dataclass
class TrialRecord:
    """One finished trial: ``kind`` is ``candidate`` or ``baseline`` (then ``name`` is its name).

    ``number`` counts this process's trials; ``trial_id`` is unique across every process of a
    shared search and tags the trial's child run, so a resumed process finds its own half-written
    runs and never another's. (Checkpoints written before it existed have ``None``.) In the
    checkpoint (and in a shared study) ``arch`` and ``result`` are their plain dicts: see
    :meth:`to_dict` and :meth:`from_dict`.
    """

    number: int
    kind: str
    name: str
    arch: Architecture
    result: TrialResult
    run_id: str | None = None
    trial_id: str | None = None
    reused_from: str | None = None  # a baseline reused from an earlier run (search.running.reuse), not trained here

    def to_dict(self) -> dict[str, Any]:
        out = {"number": self.number, "kind": self.kind, "name": self.name, "arch": self.arch.to_dict(),
               "result": self.result.to_dict(), "run_id": self.run_id, "trial_id": self.trial_id}
        return out if self.reused_from is None else {**out, "reused_from": self.reused_from}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        return cls(number=d["number"], kind=d["kind"], name=d["name"], arch=Architecture.from_dict(d["arch"]),
                   result=TrialResult.from_dict(d["result"]), run_id=d.get("run_id"), trial_id=d.get("trial_id"),
                   reused_from=d.get("reused_from"))


@dataclass
class SearchState:
    parent_run_id: str
    config: dict[str, Any]
    strategy: dict[str, Any] = field(default_factory=dict)
    trials: list[TrialRecord] = field(default_factory=list)
    done: bool = False
    plan: list[dict[str, Any]] = field(default_factory=list)  # genotypes to retrain (oneshot, dnas)
    elapsed: float = 0.0  # wall-clock seconds the search had spent at this checkpoint (time budget)
    identity: dict[str, Any] = field(default_factory=dict)  # what makes its results comparable (search.identity)

    def candidates(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.kind == "candidate"]

    def baselines(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.kind == "baseline"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION, "parent_run_id": self.parent_run_id, "config": self.config,
            "strategy": self.strategy, "done": self.done, "trials": [t.to_dict() for t in self.trials],
            "plan": self.plan, "elapsed": self.elapsed, "identity": self.identity,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchState:
        if d.get("version") != VERSION:
            raise UserError(f"search checkpoint version {d.get('version')!r} is not {VERSION}")
        return cls(parent_run_id=d["parent_run_id"], config=d["config"], strategy=d["strategy"],
                   trials=[TrialRecord.from_dict(t) for t in d["trials"]], done=bool(d.get("done", False)),
                   plan=list(d.get("plan", [])), elapsed=float(d.get("elapsed", 0.0)),
                   identity=dict(d.get("identity") or {}))


def save_state(path: Path, state: SearchState) -> None:
    """Write ``state`` to ``path`` atomically (a temporary file, fsync, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state.to_dict(), f, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(path: Path) -> SearchState:
    if not path.is_file():
        raise UserError(f"{path}: search checkpoint not found")
    try:
        return SearchState.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: not a readable search checkpoint ({e})") from None
    except UserError as e:  # another version
        raise UserError(f"{path}: {e}") from None
    except RecursionError:  # the JSON parser's own limit on nesting
        raise UserError(f"{path}: not a readable search checkpoint (JSON nested too deep)") from None


def new_trial_id() -> str:
    """A trial identity no other process of any search draws (a random UUID)."""
    return uuid.uuid4().hex


def process_key() -> str:
    """This process among those sharing a search: ``host-pid`` (a file-name-safe string)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    return f"{host}-{os.getpid()}"


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` among processes of this machine (a lock file inside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_writable(path: Path, key: str) -> None:
    """Refuse a folder a search could not write to (a :class:`UserError` naming ``key`` and the
    path), creating nothing: ``path`` or its nearest existing ancestor must be a directory in which
    a file can be made (a probe file, removed at once; it finds read-only file systems and
    permissions alike, whoever runs the search)."""
    import tempfile

    path = Path(path).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"config key {key!r}: {path} cannot be a folder: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise UserError(f"config key {key!r}: cannot write under {existing}: {e.strerror or type(e).__name__}") from None
