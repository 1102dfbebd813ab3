"""What random search and evolution remember: the architectures proposed and their results.

Two backends with one interface:

* :class:`LocalHistory` (the default): plain lists, saved whole in the strategy's ``state_dict``.
* :class:`StudyHistory` (given a :class:`~rankitect.search.running.shared_study.SharedStudy`): every proposal is
  an Optuna trial of a shared study, its params the flat sample of the space, its value the
  objective. Processes sharing the study share one history: duplicates are rejected across all
  of them (running trials included), and evolution draws its population from the most recently
  finished trials of every process, which is asynchronous regularized evolution over one shared
  population (as run by Real et al. with many workers). The ``state_dict`` then only keeps this
  process's running trials; the rest lives in the database. The study also holds TPE's trials
  when ``tpe`` shares it (one objective, minimized), so a search may change strategy midway.

Records are kept in the order they finished; failed ones have value ``inf`` (worst).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import rankitect.search._optuna as _optuna
from rankitect.search.base import Space
from rankitect.search.running.shared_study import SharedStudy, proposal_lock


@dataclass(frozen=True)
class Record:
    """One finished proposal: genotype hash, flat sample (``space.decode`` gives it back), value."""

    hash: str
    sample: dict[str, Any]
    value: float  # the objective; inf when the trial failed


class LocalHistory:
    """In-process history, serialized in full."""

    def __init__(self) -> None:
        self._finished: list[Record] = []
        self._pending: dict[str, dict[str, Any]] = {}

    def start(self, h: str, sample: dict[str, Any]) -> bool:
        self._pending[h] = sample
        return True

    def finish(self, h: str, value: float, *, pruned: bool = False) -> None:
        """Finish pending ``h`` with objective ``value`` (``inf`` when failed or pruned)."""
        sample = self._pending.pop(h)
        self._finished.append(Record(h, sample, value))

    def record(self, h: str, sample: dict[str, Any], value: float) -> None:
        """Add a finished trial that was never proposed (a baseline)."""
        self._finished.append(Record(h, sample, value))

    def is_pending(self, h: str) -> bool:
        return h in self._pending

    def finished(self) -> list[Record]:
        return list(self._finished)

    def seen(self) -> set[str]:
        return {r.hash for r in self._finished} | set(self._pending)

    def state_dict(self) -> dict[str, Any]:
        # JSON has no inf: a failed record is stored with value None
        finished = [[r.hash, r.sample, None if math.isinf(r.value) else r.value] for r in self._finished]
        return {"finished": finished, "pending": dict(self._pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._finished = [Record(h, s, math.inf if v is None else v) for h, s, v in state["finished"]]
        self._pending = dict(state["pending"])


class StudyHistory:
    """History kept in a named Optuna study of an RDB storage, shared by every process using it."""

    def __init__(self, space: Space, shared: SharedStudy) -> None:
        self.space, self.shared = space, shared
        self.study = shared.open(["minimize"])
        self._pending: dict[str, int] = {}  # genotype hash -> trial number, this process only

    def start(self, h: str, sample: dict[str, Any]) -> bool:
        """Record the proposal; ``False`` when another process recorded the same genotype at the
        same moment (both passed the ``seen`` check): the earlier trial number keeps it, ours is
        marked a duplicate and failed, and the caller proposes again."""
        with proposal_lock(self.shared):  # record and check in one step among the processes
            trial = _optuna.record_trial(self.study, self.space, sample, {_optuna.HASH_ATTR: h})
            earlier = [t for t in self.study.get_trials(deepcopy=False)
                       if _optuna.counts(t) and t.user_attrs[_optuna.HASH_ATTR] == h and t.number < trial.number]
        if earlier:
            trial.set_user_attr(_optuna.DUPLICATE_ATTR, earlier[0].number)
            self.study.tell(trial, state=_optuna.import_optuna().trial.TrialState.FAIL)
            return False
        self._pending[h] = trial.number
        return True

    def record(self, h: str, sample: dict[str, Any], value: float) -> None:
        """Add a finished trial that was never proposed (a baseline; outside the trial budget)."""
        trial = _optuna.record_trial(self.study, self.space, sample, {_optuna.HASH_ATTR: h, _optuna.BASELINE_ATTR: True})
        optuna = _optuna.import_optuna()
        state = "FAIL" if math.isinf(value) else "COMPLETE"
        self.study.tell(trial.number, None if state == "FAIL" else value, state=optuna.trial.TrialState[state])

    def finish(self, h: str, value: float, *, pruned: bool = False) -> None:
        """Tell the study: COMPLETE with ``value``, FAIL (``inf``), or PRUNED (its budget slot is free)."""
        number = self._pending.pop(h)
        state = "PRUNED" if pruned else "FAIL" if math.isinf(value) else "COMPLETE"
        optuna = _optuna.import_optuna()
        self.study.tell(number, value if state == "COMPLETE" else None, state=optuna.trial.TrialState[state])

    def is_pending(self, h: str) -> bool:
        return h in self._pending

    def finished(self) -> list[Record]:
        states = _optuna.import_optuna().trial.TrialState
        done = self.study.get_trials(deepcopy=False, states=(states.COMPLETE, states.FAIL, states.PRUNED))
        done = [t for t in done if _optuna.counts(t)]
        done.sort(key=lambda t: (t.datetime_complete, t.number))  # the order they finished in, all processes
        return [
            Record(t.user_attrs[_optuna.HASH_ATTR], t.params, math.inf if t.value is None else t.value) for t in done
        ]

    def seen(self) -> set[str]:
        trials = self.study.get_trials(deepcopy=False)
        return {t.user_attrs[_optuna.HASH_ATTR] for t in trials if _optuna.counts(t)}

    def state_dict(self) -> dict[str, Any]:
        return {"pending": dict(self._pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = {h: int(n) for h, n in state["pending"].items()}


def observe(space: Space, history: LocalHistory | StudyHistory, arch: Any, value: float) -> bool:
    """Record ``arch`` (trained outside the strategy) as a finished trial of objective ``value``
    when it lies in ``space`` and is new to ``history``; returns whether it was recorded."""
    sample = space.encode(arch)
    if sample is None:
        return False
    h = str(arch.hash)
    if h in history.seen():
        return False
    history.record(h, sample, value)
    return True


def make_history(space: Space, shared: SharedStudy | None) -> LocalHistory | StudyHistory:
    """:class:`LocalHistory` without a shared study, else :class:`StudyHistory`."""
    if shared is None:
        return LocalHistory()
    return StudyHistory(space, shared)
