"""Recording a search's trials: the checkpoint, the MLflow child runs, the kept weights.

A finished trial is written to the checkpoint first, then logged as a child run of the search's
parent run, then the checkpoint is written again with the run's id (see
:mod:`rankitect.search.running.checkpoint`); :meth:`Recorder.reconcile` logs, on resume, the trials a kill
left between the two writes. With shared storage every finished trial is also shared with the
other processes (:mod:`rankitect.search.running.shared_study`), and :meth:`Recorder.all_trials` reads theirs back.
After each trial the running best (:class:`~rankitect.search.judging.standings.Standings`) says whose
weights stay on their runs (:mod:`rankitect.search.running.kept`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rankitect.config import Config

from rankitect.config_rules import to_dict
from rankitect.eval.result import TrialResult
from rankitect.search.base import STOPPED_TAG, Proposer
from rankitect.search.running.budget import TimeBudget
from rankitect.search.running.checkpoint import SearchState, TrialRecord, new_trial_id, save_state
from rankitect.search.running.kept import KeptWeights
from rankitect.search.running.shared_study import SharedStudy
from rankitect.search.judging.standings import Standings
from rankitect.search.running.trial import TrialOutput
from rankitect.signals import Stopped
from rankitect.track.names import REUSED_FROM, TRIAL as TRIAL_TAG, TRIAL_ID as TRIAL_ID_TAG
from rankitect.space.architecture import Architecture

log = logging.getLogger(__name__)
SHARED_KEYS = ("kind", "name", "arch", "result")  # what a shared study holds of a finished trial


class Recorder:
    """Writes the finished trials of one process of a search into ``state`` (checkpointed at
    ``path``) and under its parent run in ``tracker``; ``running`` holds the trials started and not
    yet recorded, by name: ``(kind, arch)``."""

    def __init__(self, state: SearchState, path: Path, *, tracker: Any, space: Any, strategy: Proposer,
                 shared: SharedStudy | None, weights: KeptWeights, standings: Standings, keep_top_k: int,
                 budget: TimeBudget) -> None:
        self.state, self.path, self.tracker, self.space, self.strategy = state, path, tracker, space, strategy
        self.shared, self.weights, self.standings, self.budget = shared, weights, standings, budget
        self.keep_top_k = keep_top_k
        self.running: dict[str, tuple[str, Architecture]] = {}
        self._others: dict[str, TrialRecord] = {}  # other processes' trials, read once each
        self._kept: set[str] | None = None  # the kept names as of the last trial recorded

    def checkpoint(self) -> None:
        """Rewrite the checkpoint, with the time spent so far."""
        self.state.elapsed = self.budget.spent()
        save_state(self.path, self.state)

    def record(self, kind: str, name: str, arch: Architecture, out: TrialOutput, start: float | None,
               reused_from: str | None = None) -> TrialRecord:
        """Checkpoint the finished trial, log its child run (begun at ``start``), checkpoint again,
        share it, and move or drop its weights (and those of trials no longer kept).
        ``reused_from``: a baseline reused from that run, not trained here."""
        self.running.pop(name, None)
        if self._kept is None:
            self._kept = self._keep()
        record = TrialRecord(number=len(self.state.trials), kind=kind, name=name, arch=arch, result=out.result,
                             trial_id=new_trial_id(), reused_from=reused_from)
        if out.result.ok:  # before the record that refers to them
            self.standings.val_losses.save(name, out.val_losses)
            self.standings.held["test"].save(name, out.test_losses)
            self.standings.held["verdict"].save(name, out.verdict_losses)
        self.state.trials.append(record)
        self.state.strategy = self.strategy.state_dict()
        self.checkpoint()
        self._log_child(record, out.history, start, out.ended)
        save_state(self.path, self.state)
        if self.shared is not None:
            self.shared.share({k: v for k, v in record.to_dict().items() if k in SHARED_KEYS})
        self.keep_weights()
        return record

    def line(self, record: TrialRecord, total: int) -> str:
        """The finished trial's line (:func:`trial_line`) among ``total`` candidates, with what the
        surrogate predicted of a candidate it guided."""
        done = sum(1 for t in self.state.candidates() if not t.result.pruned)
        line = trial_line(record, done, total)
        predicted = self._predicted(record)
        return line + (f"  (surrogate predicted val/ne {predicted[0]:.4f} +- {predicted[1]:.4f})" if predicted else "")

    def _predicted(self, record: TrialRecord) -> tuple[float, float] | None:
        if record.kind != "candidate":
            return None
        return getattr(self.strategy, "predictions", {}).get(record.name)

    def _log_child(self, record: TrialRecord, history: list[dict[str, float]], start: float | None = None,
                   end: float | None = None) -> None:
        arch, result = record.arch, record.result
        baseline = record.name if record.kind == "baseline" else None
        choices = self.space.encode(arch)  # the space's flat labels, for MLflow's compare views
        params = {} if choices is None else {k: choices[k] for k in self.space.active(choices)}
        record.run_id = self.tracker.log_trial(self.state.parent_run_id, arch, result, _trial_tags(record),
                                               baseline=baseline, params=params, start_time=start, end_time=end,
                                               history=history)
        predicted = self._predicted(record)
        if predicted is not None:  # what the surrogate expected of it, beside the measured val/ne
            self.tracker.log_metrics(record.run_id, {"surrogate/predicted_ne": predicted[0],
                                                     "surrogate/spread": predicted[1]})
        if result.cost is not None and result.cost.rocs_metrics():  # measured once, before training
            self.tracker.log_metrics(record.run_id, result.cost.rocs_metrics())

    def all_trials(self) -> list[TrialRecord]:
        """This process's trials, plus (with shared storage) those every other process has finished."""
        trials = list(self.state.trials)
        if self.shared is not None:
            names = {t.name for t in trials}
            for e in self.shared.trials():
                if e["name"] not in names and e["name"] not in self._others:
                    self._others[e["name"]] = TrialRecord.from_dict({**e, "number": -1})
            trials += [t for name, t in self._others.items() if name not in names]
        return trials

    def reconcile(self, storage: str | None) -> None:
        """Log trials the checkpoint holds but MLflow may not (killed between the two writes).

        A half-written child run is found by the trial's global ``trial_id`` (in a shared search
        every process numbers its trials from 0, so a number would also match other processes' runs).
        """
        for record in self.state.trials:
            if record.run_id is not None:
                continue
            # half-written by the killed process
            if record.trial_id is not None:
                self.tracker.delete_child_runs(self.state.parent_run_id, TRIAL_ID_TAG, record.trial_id)
            elif not storage:  # an older checkpoint: its numbers are unique in its search
                self.tracker.delete_child_runs(self.state.parent_run_id, TRIAL_TAG, str(record.number))
            self._log_child(record, [])
            save_state(self.path, self.state)

    def _keep(self) -> set[str]:
        """The names of this process's trials whose weights are kept, the running best updated."""
        self.standings.update(self.all_trials())
        return self.standings.kept(self.state.trials, self.keep_top_k)

    def keep_weights(self) -> None:
        """Move the kept trials' weights to their runs, delete the others' and take them off the runs
        of trials kept until now and no longer (see :class:`~rankitect.search.running.kept.KeptWeights`)."""
        kept = self._keep()
        self.weights.sync(self.state.trials, kept, (self._kept or set()) - kept)
        self._kept = kept

    def stop(self, stop: Stopped, store_args: str, *, owner: bool) -> str:
        """After a signal: this process's running trials become KILLED child runs (and leave the
        shared budget), the parent run is KILLED (by its ``owner``), and the checkpoint, rewritten
        after every finished trial, is where ``--resume`` continues. Returns the line that says how
        (``store_args``: the run store's arguments for the command)."""
        why = f"stopped by {stop.name}"
        for name, (kind, arch) in self.running.items():
            self.tracker.log_trial(self.state.parent_run_id, arch, TrialResult.failure(why), {TRIAL_TAG: "stopped"},
                                   baseline=name if kind == "baseline" else None, status="KILLED")
        if self.shared is not None and self.running:
            self.shared.release(list(self.running), why)
        self.running.clear()
        self.checkpoint()  # the stopped trial's time was spent too
        if owner:
            self.tracker.end_run(self.state.parent_run_id, "KILLED")
        return (f"search {why}: {len(self.state.candidates())} candidates finished; continue it with "
                f"rankitect search --resume {self.state.parent_run_id}{store_args}")


def open_parent(cfg: Config, tracker: Any, space: Any, identity: dict[str, Any],
                shared: SharedStudy | None) -> tuple[SearchState, bool]:
    """A new search's state under a new parent run, and whether this process owns that run (with
    shared storage one process creates it, the others join it; one of another identity is refused)."""
    def new_parent() -> str:
        parent = tracker.start_search(to_dict(cfg), cfg.search.strategy, space)
        tracker.log_dict(parent, identity, "identity.json")
        return parent

    parent, owner = (new_parent(), True) if shared is None else shared.parent_run(new_parent, identity)
    return SearchState(parent_run_id=parent, config=to_dict(cfg), identity=identity), owner


def record_verdict(tracker: Any, parent_run_id: str, folder: Path, verdict: Any, trials: list[TrialRecord], *,
                   seconds: float, entropy: float | None, search_seconds: float) -> None:
    """The search's :class:`~rankitect.search.judging.verdict.Verdict` as ``verdict.json`` in its
    folder and on its run, with what it cost (the final choice's ``seconds``, every trial's scoring
    of the held-out rows) beside the search's own seconds, and the held-out NE on the runs it judged."""
    import json

    scoring = sum(t.result.held_out_seconds or 0.0 for t in trials if not t.reused_from)
    record = {**verdict.to_dict(), "entropy": entropy, "seconds": seconds, "scoring_seconds": scoring,
              "search_seconds": search_seconds}
    (folder / "verdict.json").write_text(json.dumps(record, indent=2) + "\n")
    tracker.log_verdict(parent_run_id, record, {t.name: t.run_id for t in trials if t.run_id is not None})


def end_failed(tracker: Any, parent_run_id: str, error: BaseException) -> None:
    """End the parent run after ``error``: KILLED by a signal, else FAILED with the reason as a tag."""
    try:
        if isinstance(error, Stopped):
            tracker.end_run(parent_run_id, "KILLED")
        else:
            tracker.fail_run(parent_run_id, f"{type(error).__name__}: {error}")
    except Exception as e:  # the store itself may be what failed: the first error is the one to raise
        log.warning("search run %s not closed: %s", parent_run_id, e)


def _trial_tags(record: TrialRecord) -> dict[str, str]:
    tags = {TRIAL_TAG: str(record.number)}
    if record.trial_id is not None:
        tags[TRIAL_ID_TAG] = record.trial_id
    if record.result.stopped:
        tags[STOPPED_TAG] = record.result.stopped
    if record.reused_from:
        tags[REUSED_FROM] = record.reused_from
    return tags


def trial_line(record: TrialRecord, n_done: int, n_total: int) -> str:
    """One finished trial. A candidate that holds a slot of the budget is ``[n/N]`` (n never past
    N: a pruned one gives its slot back and is ``[pruned]``); a baseline is ``[baseline]``."""
    r = record.result
    if record.kind != "candidate":
        head = "[baseline]"
    else:
        head = "[pruned]" if r.pruned else f"[{min(n_done, n_total)}/{n_total}]"
    if r.pruned:
        ne = f"val/ne {r.val_ne:.4f}" if r.val_ne is not None else "no validation"
        return f"{head} {record.name} pruned: {ne} after {r.steps} steps, {r.train_seconds:.1f} s"
    if not r.ok:
        return f"{head} {record.name} FAILED: {r.error}"
    stopped = f"  stopped by the {r.stopped} after {r.steps} steps (its best validation kept)" if r.stopped else ""
    return (f"{head} {record.name}  val/ne {r.val_ne:.4f}  test/ne {r.test_ne:.4f}  "
            f"test/auc {r.test_auc:.4f}  {r.mflops:.3f} MFLOPs  {r.train_seconds:.1f} s{stopped}")
