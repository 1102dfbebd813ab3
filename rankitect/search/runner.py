"""The search runner: one loop, propose -> train and score -> record, for every strategy.

``SearchRunner(cfg).run()`` trains the hand-designed baselines under the search's budget, starts
the strategy (a :class:`~rankitect.search.base.Proposer` from the one registry; ``oneshot`` and
``dnas`` train their supernet here), then trains what it proposes until its budget
(``search.trials``, or a supernet's ``top_k``) has finished, across every process sharing
``search.storage`` (:mod:`rankitect.search.shared`), in this process or in a local pool of
``search.workers`` processes. After every finished trial the checkpoint is rewritten (see
:mod:`rankitect.search.checkpoint`); ``resume(run_id)`` continues a killed search exactly where its
checkpoint stands. A candidate that fails becomes a FAILED child run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from rankitect.config import Config, config_from_dict, rename_old_keys, to_dict
from rankitect.errors import UserError
from rankitect.eval.objective import at_most
from rankitect.eval.result import TrialResult
from rankitect.search.base import STOPPED_TAG, Proposer, SearchContext, SpaceExhausted, arch_hash
from rankitect.search.budget import TimeBudget, parse_duration, spending
from rankitect.search.checkpoint import (SearchState, TrialRecord, check_writable, folder_lock, load_state,
                                         new_trial_id, process_key, save_state)
from rankitect.search.factory import check_names, objective_from_config, strategy_from_config
from rankitect.search.identity import config_identity, refuse_difference, search_identity
from rankitect.search.kept import KeptWeights
from rankitect.search.plan import PlanProposer
from rankitect.search.selection import TARGET_RULES, Choice, Entrant, ValLosses, auto_target, choose_winner
from rankitect.search.progress import LineProgress
from rankitect.search.pruning import Rungs, RungTicket
from rankitect.search.shared import SharedStudy
from rankitect.signals import StopGuard, Stopped, stop_on_signals
from rankitect.search.trial import InlineRunner, StepFile, TrialOutput, TrialPool, trial_output
from rankitect.space.architecture import Architecture
from rankitect.track.names import CHECKPOINT as CHECKPOINT_TAG, TRIAL as TRIAL_TAG, TRIAL_ID as TRIAL_ID_TAG

log = logging.getLogger(__name__)


@dataclass
class SearchOutcome:
    parent_run_id: str
    table: pd.DataFrame
    best: Architecture | None
    out_dir: Path
    spending: dict[str, float] | None = None  # seconds by what they went to (see rankitect.search.budget)
    choice: Choice | None = None  # the winner and why: the closing lines (Choice.lines)


def search_dir(cfg: Config, uri: str, parent_run_id: str) -> Path:
    """Where a search keeps its checkpoint, Pareto table and best genotype."""
    return searches_root(cfg, uri) / parent_run_id


def searches_root(cfg: Config, uri: str) -> Path:
    """The folder of every search's folder: ``search.output_dir``, else beside the run store."""
    from rankitect.track import artifact_root

    if cfg.search.output_dir:
        return Path(cfg.search.output_dir).expanduser().resolve()
    root = artifact_root(uri)
    return root.parent / "searches" if root is not None else Path("rankitect-searches").resolve()


def check_paths(cfg: Config) -> None:
    """Refuse a run store or search folder that cannot be written (a ``UserError`` naming the key
    and the path), before any data is read or any run opened."""
    from rankitect.track.store import SQLITE, resolve_uri

    uri = resolve_uri(cfg.track.uri)
    if uri.startswith(SQLITE) and ":memory:" not in uri:
        db = Path(uri[len(SQLITE):])
        check_writable(db.parent, "track.uri")
        if db.exists() and not (db.is_file() and os.access(db, os.W_OK)):
            raise UserError(f"config key 'track.uri': {db} is not a writable file")
    check_writable(searches_root(cfg, uri), "search.output_dir" if cfg.search.output_dir else "track.uri")


class SearchRunner:
    """Runs one search described by ``cfg``; ``echo`` receives one line per finished trial;
    ``clock`` (monotonic seconds) measures ``search.time_budget``."""

    def __init__(
        self, cfg: Config, *, state: SearchState | None = None, echo: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from rankitect.data import open_data
        from rankitect.search.sizing import space_for
        from rankitect.track import Tracker
        from rankitect.train.protocol import Schedule, check_warmup

        check_names(cfg.search)  # before the data set is opened (and maybe cached)
        check_paths(cfg)  # before anything is read, created or written
        self.cfg, self.echo = cfg, echo
        self.progress = LineProgress(echo)  # see watch()
        budget_seconds = parse_duration(cfg.search.time_budget)  # config errors before any data is read
        check_warmup(cfg.train)
        self.guard = StopGuard()  # replaced by the installed one while ``run`` runs
        self.running: dict[str, tuple[str, Architecture]] = {}  # name -> (kind, arch): trials in flight
        self.owner = True  # created the parent run (with shared storage, one process does)
        self.train_cfg = replace(cfg.train, progress=False)  # one line per trial instead of bars
        # processes sharing search.storage coordinate through it (rankitect.search.shared)
        # (a storage without a study name is the strategy's config error, below)
        shared = cfg.search.storage is not None and cfg.search.study_name
        self.shared = SharedStudy(cfg.search.storage, cfg.search.study_name) if shared else None
        self._check_identity(config_identity(cfg), state)  # a config that differs: refused before the data is read
        self.data = open_data(cfg.data.source, cfg.data, progress=_isatty(sys.stderr))  # no carriage returns in a log
        self.identity = search_identity(cfg, self.data)
        self._check_identity(self.identity, state)
        check_warmup(cfg.train, Schedule.for_data(cfg.train, self.data).total_steps)
        self.space = space_for(cfg.search.space, self.data.spec, cfg.search.flops_range, rocs=cfg.search.rocs)
        self.objective = objective_from_config(cfg.search)
        self.strategy: Proposer = strategy_from_config(cfg.search, self.space)  # proposes every candidate
        self.tracker = Tracker(cfg.track.uri, cfg.track.experiment)
        self.state = state if state is not None else self._start()
        try:
            self._open(state, budget_seconds, clock)
        except BaseException as e:
            if state is None and self.owner:  # the run this process opened ends with the reason
                self._end_failed(e)
            raise

    def _open(self, state: SearchState | None, budget_seconds: float | None, clock: Callable[[], float]) -> None:
        """The rest of the constructor, once the parent run exists: checkpoint, folder, weights."""
        cfg = self.cfg
        if state is not None and state.strategy:
            self.strategy.load_state_dict(state.strategy)
        self.out_dir = search_dir(cfg, self.tracker.uri, self.state.parent_run_id)
        self.weights = KeptWeights(self.tracker, self.out_dir, self.data.spec)
        self.val_losses = ValLosses(self.out_dir)  # per-example validation losses: the winner's paired test
        # With shared storage the processes share the parent run and its folder: the owner keeps
        # ``state.json`` (what --resume finds), every other process a checkpoint of its own.
        self.path = self.out_dir / ("state.json" if self.owner else f"state-{process_key()}.json")
        tag = CHECKPOINT_TAG if self.owner else f"{CHECKPOINT_TAG}.{process_key()}"
        self.tracker.set_tag(self.state.parent_run_id, tag, str(self.path))
        self.budget = TimeBudget(budget_seconds, clock=clock, elapsed=self.state.elapsed)
        self.rungs: Rungs | None = None
        self._tickets: dict[Future, RungTicket | None] = {}
        save_state(self.path, self.state)

    def _check_identity(self, mine: dict[str, Any], state: SearchState | None) -> None:
        """Refuse to resume ``state``, or to join the shared search, with another identity than
        the search's (see :mod:`rankitect.search.identity`)."""
        if state is not None:
            # an older checkpoint: its config, keys renamed since moved over
            recorded = state.identity or config_identity(config_from_dict(rename_old_keys(state.config)))
            refuse_difference(mine, recorded, f"--resume {state.parent_run_id}", "here")
        elif self.shared is not None:
            recorded = self.shared.identity()
            if recorded is not None:
                refuse_difference(mine, recorded, f"study {self.shared.name!r} of {self.shared.storage}",
                                  "in this process")

    def _end_failed(self, error: BaseException) -> None:
        """End the parent run after ``error``: KILLED by a signal, else FAILED with the reason as a tag."""
        try:
            if isinstance(error, Stopped):
                self.tracker.end_run(self.state.parent_run_id, "KILLED")
            else:
                self.tracker.fail_run(self.state.parent_run_id, f"{type(error).__name__}: {error}")
        except Exception as e:  # the store itself may be what failed: the first error is the one to raise
            log.warning("search run %s not closed: %s", self.state.parent_run_id, e)

    @classmethod
    def resume(cls, run_id: str, cfg: Config, overrides: list[str] = (), **kw: Any) -> SearchRunner:
        """Continue the search of parent run ``run_id`` with its own config plus ``overrides``."""
        from rankitect.track import Tracker

        tracker = Tracker(cfg.track.uri, cfg.track.experiment)
        try:
            tags = tracker.run_tags(run_id)
        except UserError:
            raise UserError(f"--resume {run_id}: no such run in {tracker.uri}") from None
        path = tags.get(CHECKPOINT_TAG)
        if not path:
            raise UserError(f"--resume {run_id}: that run is not a rankitect search (no {CHECKPOINT_TAG} tag)")
        state = load_state(Path(path))
        saved = config_from_dict(rename_old_keys(state.config), list(overrides))
        saved.track = cfg.track
        return cls(saved, state=state, **kw)

    # --- the loop --------------------------------------------------------------------------------

    def watch(self, progress: LineProgress) -> None:
        """Report to ``progress`` (e.g. a :class:`~rankitect.search.progress.SearchProgress` bar)."""
        self.progress, self.echo = progress, progress.write

    def finished_results(self) -> list[TrialResult]:
        """The results of the trials this process's checkpoint holds (what a progress display starts from)."""
        return [TrialResult.from_dict(t.result) for t in self.state.trials]

    def estimate(self) -> Any:
        """How long the trials left will take, from the baselines timed here
        (:func:`~rankitect.search.estimate.estimate_search`); ``None`` without baselines to time."""
        from rankitect.search.estimate import estimate_search
        from rankitect.space.baselines import get_baseline

        if self.state.done or not self.cfg.search.baselines:
            return None
        left = self.trial_budget() - len([t for t in self.state.trials if t.result["status"] != "pruned"])
        try:
            archs = {n: get_baseline(n, self.data.spec) for n in self.cfg.search.baselines}
            return estimate_search(archs, self.data, self.train_cfg, trials_left=left,
                                   workers=self.cfg.search.workers, budget_left=self.budget.left())
        except Exception as e:  # noqa: BLE001 - an estimate never stops a search; its trials report their faults
            log.debug("no estimate: %s: %s", type(e).__name__, e)
            return None

    def trial_budget(self) -> int:
        """Trials this search runs in all (baselines and candidates): the progress bar's total."""
        return (len(self.cfg.search.baselines) if self.owner else 0) + self.candidate_budget()

    def candidate_budget(self) -> int:
        """How many candidates the search trains: ``search.trials``, or what the strategy says
        (a supernet's ``top_k``)."""
        return self.strategy.budget(self.cfg.search.trials)

    def run(self) -> SearchOutcome:
        """Run the search to its end; SIGTERM or SIGINT stop it cleanly (see :meth:`_stopped`) and
        raise :class:`~rankitect.signals.Stopped` (exit status 128 + the signal)."""
        runner = self._trial_runner()
        with stop_on_signals() as self.guard:
            try:
                self._reconcile()
                self._open_rungs()
                self._run_baselines(runner)
                self._start_from_baselines()
                self._start_strategy()
                self._run_candidates(runner)
                return self._finish()
            except Stopped as stop:
                runner.abort()
                with self.guard.deferred():
                    self._stopped(stop)
                raise
            except Exception as e:  # refused or broken: the run ends FAILED with the reason, not RUNNING
                runner.abort()
                if self.owner:
                    with self.guard.deferred():
                        self._end_failed(e)
                raise
            finally:
                runner.close()

    def _stopped(self, stop: Stopped) -> None:
        """After a signal: this process's running trials become KILLED child runs (and leave the
        shared budget), the parent run is KILLED (by its owner), and the checkpoint, rewritten after
        every finished trial, is where ``--resume`` continues."""
        why = f"stopped by {stop.name}"
        for name, (kind, arch) in self.running.items():
            self.tracker.log_trial(self.state.parent_run_id, arch, TrialResult.failure(why), {TRIAL_TAG: "stopped"},
                                   baseline=name if kind == "baseline" else None, status="KILLED")
        if self.shared is not None and self.running:
            self.shared.release(list(self.running), why)
        self.running.clear()
        self.state.elapsed = self.budget.spent()  # the stopped trial's time was spent too
        save_state(self.path, self.state)
        if self.owner:
            self.tracker.end_run(self.state.parent_run_id, "KILLED")
        from rankitect.track.store import store_args

        self.echo(f"search {why}: {len(self.state.candidates())} candidates finished; continue it with "
                  f"rankitect search --resume {self.state.parent_run_id}{store_args(self.tracker.uri)}")

    def _open_rungs(self) -> None:
        """The rung study of successive halving (``search.pruning``: asha or hyperband), see
        :mod:`~rankitect.search.pruning`."""
        search = self.cfg.search
        if search.pruning != "none":
            self.rungs = Rungs(search.storage, search.study_name, self.out_dir / "rungs.journal",
                               reduction=search.pruning_reduction, min_validations=search.pruning_min_validations,
                               rule=search.pruning)

    def _submit(self, runner: InlineRunner | TrialPool, kind: str, name: str, arch: Architecture, *,
                prune: bool) -> Future:
        """Start training ``arch`` (reporting to the rung study, where pruning is on), noting it as
        running until :meth:`_record` writes it."""
        self.running[name] = (kind, arch)
        ticket = self.rungs.ticket(name, prune=prune) if self.rungs is not None else None
        if isinstance(runner, TrialPool):  # the worker notes its steps in a file the display reads
            steps_file = self.out_dir / "running" / f"{name}.json"
            steps_file.parent.mkdir(parents=True, exist_ok=True)
            steps_file.unlink(missing_ok=True)
            self.progress.started(name, steps_file=steps_file)
            on_step: Any = StepFile(str(steps_file))
        else:
            self.progress.started(name)
            on_step = self.progress.stepper(name)
        future = runner.submit(arch, self.train_cfg, self._weights_path(name), ticket, deadline=self.budget.deadline(),
                               on_step=on_step)
        self._tickets[future] = ticket
        return future

    def _output(self, future: Future) -> TrialOutput:
        """A finished future's output; its rung-study trial is closed with the result."""
        out = trial_output(future)
        ticket: RungTicket | None = self._tickets.pop(future, None)
        if ticket is not None and self.rungs is not None:
            self.rungs.close(ticket, out.result)
        return out

    def _trial_runner(self) -> InlineRunner | TrialPool:
        if self.cfg.search.workers > 1:
            return TrialPool(str(self.data.path), self.cfg.search.workers, memory_budget=self.cfg.runtime.memory_budget)
        return InlineRunner(self.data, memory_budget=self.cfg.runtime.memory_budget)

    def _run_baselines(self, runner: InlineRunner | TrialPool) -> None:
        """Train the baselines under the same budget (once per search: by the parent's owner), at
        most ``search.workers`` at once, each recorded (checkpoint, child run) as soon as it
        finishes: a kill loses at most the ones running. None starts once the time budget is
        spent; a running one stops at it (see :meth:`~rankitect.search.budget.TimeBudget.deadline`)."""
        from rankitect.space.baselines import get_baseline

        if not self.owner:
            return
        done = {t.name for t in self.state.baselines()}
        todo = [n for n in self.cfg.search.baselines if n not in done]
        pending: dict[Future, tuple[str, Architecture]] = {}
        while todo or pending:
            while todo and len(pending) < max(1, self.cfg.search.workers) and not self.budget.exhausted():
                name = todo.pop(0)
                arch = get_baseline(name, self.data.spec)
                pending[self._submit(runner, "baseline", name, arch, prune=False)] = (name, arch)
            if not pending:
                self.echo(f"time budget spent ({self._budget_words()}): baseline{'s' * (len(todo) > 1)} "
                          f"{', '.join(todo)} not trained (--resume with a larger search.time_budget trains them)")
                return
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                name, arch = pending.pop(future)
                self._record("baseline", name, arch, self._output(future))

    def _budget_words(self) -> str:
        return f"{self.budget.spent() / 60:.1f} of {self.budget.seconds / 60:.1f} min"

    def _start_from_baselines(self) -> None:
        """Resolve ``target_mflops: auto`` (or ``cheapest``) to a baseline's FLOPs (see
        :func:`~rankitect.search.selection.auto_target`) and ``pruning_min_validations: auto`` from
        the baselines' curves (:meth:`~rankitect.search.pruning.Rungs.calibrate`), then tell the strategy every trained
        baseline its space holds, so the search starts from them (both idempotent on resume)."""
        view = self._wait_for_view() if self.shared is not None and not self.owner else None
        bases = [(t.name, Architecture.from_dict(t.arch), TrialResult.from_dict(t.result))
                 for t in self._all_trials() if t.kind == "baseline"]
        if view is not None:
            self._take_view(view, echo=True)
        else:
            self._resolve(bases)
        taken = [name for name, arch, r in bases if self.strategy.observe(arch, r)]
        if taken:
            self.echo(f"{self.cfg.search.strategy} starts from the baselines {', '.join(taken)}")

    def _resolve(self, bases: list[tuple[str, Architecture, TrialResult]]) -> None:
        """Resolve the ``auto`` (or ``cheapest``) target and first rung from ``bases``; with shared
        storage the owner publishes them (:meth:`~rankitect.search.shared.SharedStudy.publish_view`)
        for every other process, so that all of them rank and prune by one rule."""
        rule = self.cfg.search.target_mflops
        if rule in TARGET_RULES:
            found = auto_target([self._entrant("baseline", name, r) for name, _, r in bases],
                                self.cfg.search.min_gain_se, self.objective, rule=str(rule))
            self.objective = self.objective.with_target(found.mflops if found else None)
            self.echo(found.line(self.cfg.search.min_gain_se) if found
                      else f"target_mflops {rule}: no baseline finished; ranking by NE alone")
            self.strategy.objective = self.objective
        placed = self.rungs.calibrate() if self.rungs is not None else None
        if placed is not None and placed[1] is None:
            self.echo("pruning_min_validations auto: fewer than 2 baselines finished; first rung at 1 validation")
        elif placed is not None:
            self.echo(f"pruning_min_validations auto: first rung at {placed[0]} validation{'s' * (placed[0] > 1)} "
                      f"(the earliest at which successive halving over the baselines keeps the best, {placed[1]})")
        if self.shared is not None and self.owner:
            self.shared.publish_view({"target_mflops": self.objective.target_mflops, "baselines": [b[0] for b in bases],
                                      "min_validations": None if self.rungs is None else self.rungs.min_validations})

    def _take_view(self, view: dict[str, Any], *, echo: bool) -> None:
        """Rank and prune by what the search's owner resolved from the baselines."""
        rule = self.cfg.search.target_mflops
        if rule in TARGET_RULES:
            self.objective = self.objective.with_target(view["target_mflops"])
            self.strategy.objective = self.objective
            if echo:
                target = view["target_mflops"]
                self.echo(f"target_mflops {rule}: " + ("no baseline finished; ranking by NE alone" if target is None else
                          f"{target:.4f} MFLOPs (from the baselines {', '.join(view['baselines'])})"))
        if self.rungs is not None and self.rungs.auto and view["min_validations"] is not None:
            self.rungs.min_validations = view["min_validations"]
            if echo:
                self.echo(f"pruning_min_validations auto: first rung at {view['min_validations']} validations")

    def _wait_for_view(self) -> dict[str, Any] | None:
        """What the owner resolved from the baselines, waiting while it trains them; None when this
        process's time budget runs out first (it then resolves from what is there). A search whose
        parent run has ended before that (its owner stopped) is an error saying how to go on."""
        from rankitect.track.store import store_args

        view, delay, said = self.shared.view(), 0.2, False
        while view is None:
            status = self.tracker.get_run(self.state.parent_run_id).info.status
            if status != "RUNNING":
                raise UserError(f"search run {self.state.parent_run_id} is {status} before its baselines finished: "
                                f"continue it with rankitect search --resume {self.state.parent_run_id}"
                                f"{store_args(self.tracker.uri)}, then start this process again")
            if self.budget.exhausted():
                return None
            if not said:
                self.echo("waiting for the search's first process to train the baselines (the ranking's target)")
                said = True
            time.sleep(delay)  # a poll of the shared storage, not an ordering of tests
            delay = min(2 * delay, 5.0)
            view = self.shared.view()
        return view

    def _start_strategy(self) -> None:
        """Hand the strategy what it may need before its first proposal (a supernet phase runs
        here), then checkpoint what it planned, before any of it is trained."""
        if self.budget.exhausted():  # a supernet phase would start only to stop: a resume runs it
            return
        phase = "supernet" if isinstance(self.strategy, PlanProposer) and not self.strategy.planned() else None
        on_step = None if phase is None else self.progress.phase_stepper(phase)
        if phase is not None:
            self.progress.started(phase)
        context = SearchContext(
            data=self.data, train_cfg=self.train_cfg, seed=self.cfg.search.seed,
            memory_budget=self.cfg.runtime.memory_budget, flops_range=self.cfg.search.flops_range,
            tracker=self.tracker, parent_run_id=self.state.parent_run_id,
            finished={t.name for t in self.state.candidates()}, echo=self.echo,
            progress=False, deadline=self.budget.deadline(),  # its steps show in the search's line, not a bar of its own
            on_step=on_step,
        )
        try:
            self.strategy.start(context)
        finally:
            if phase is not None:
                self.progress.ended(phase)
        self.state.plan = [a.to_dict() for a in self.strategy.planned()]
        self.state.strategy = self.strategy.state_dict()
        self.state.elapsed = self.budget.spent()
        save_state(self.path, self.state)

    def _run_candidates(self, runner: InlineRunner | TrialPool) -> None:
        pending: dict[Future, Architecture] = {}
        exhausted = False
        while True:
            while not exhausted and len(pending) < self.cfg.search.workers and self._remaining(len(pending)) > 0:
                if self.budget.exhausted():
                    self.echo(f"time budget spent ({self._budget_words()}): no new candidate starts")
                    exhausted = True
                    break
                try:
                    arch = self.strategy.ask()
                except SpaceExhausted as e:
                    self.echo(f"search space exhausted: {e}")
                    exhausted = True
                    break
                if not self._within_shared_budget(arch):
                    exhausted = True  # another process took the last trial at the same moment
                    break
                pending[self._submit(runner, "candidate", arch_hash(arch), arch, prune=self.strategy.prunable)] = arch
            if not pending:
                return
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                arch = pending.pop(future)
                out = self._output(future)
                self.strategy.tell(arch, out.result)
                self._record("candidate", arch_hash(arch), arch, out)

    def _slots_done(self) -> int:
        """Candidates of this process that hold a slot of ``search.trials`` (a pruned one gives its
        slot back): what a trial line counts, never more than the budget."""
        return sum(1 for t in self.state.candidates() if t.result["status"] != "pruned")

    def _within_shared_budget(self, arch: Architecture) -> bool:
        return self.shared is None or self.shared.claim(arch_hash(arch), self.candidate_budget())

    def _remaining(self, in_flight: int) -> int:
        """Trials still to start: the budget less finished and running ones (of every process).

        A pruned trial gives its slot back, yet proposals stop at ``trials * pruning_reduction``
        (so a search whose every candidate is pruned still ends).
        """
        search, trials = self.cfg.search, self.candidate_budget()
        cap = trials * (search.pruning_reduction if search.pruning != "none" and self.strategy.prunable else 1)
        if self.shared is None:
            cands = self.state.candidates()
            finished = sum(1 for t in cands if t.result["status"] != "pruned")
            return min(trials - finished, cap - len(cands)) - in_flight
        slots, proposals = self.shared.count()
        return min(trials - slots, cap - proposals)

    # --- recording -------------------------------------------------------------------------------

    def _record(self, kind: str, name: str, arch: Architecture, out: TrialOutput) -> None:
        """Checkpoint the finished trial first, then log its child run, then checkpoint again
        (a signal arriving meanwhile stops the search once the trial is written)."""
        with self.guard.deferred():
            self._write(kind, name, arch, out)

    def _write(self, kind: str, name: str, arch: Architecture, out: TrialOutput) -> None:
        self.running.pop(name, None)
        kept_before = {t.name for t in self._kept()}
        record = TrialRecord(number=len(self.state.trials), kind=kind, name=name, arch=arch.to_dict(),
                             result=out.result.to_dict(), trial_id=new_trial_id())
        if out.result.ok:
            self.val_losses.save(name, out.val_losses)  # before the record that refers to it
        self.state.trials.append(record)
        self.state.elapsed = self.budget.spent()
        self.state.strategy = self.strategy.state_dict()
        save_state(self.path, self.state)
        self._log_child(record, out.history, out.started or self.progress.start_time(name), out.ended)
        save_state(self.path, self.state)
        if self.shared is not None:
            self.shared.share({"kind": record.kind, "name": record.name, "arch": record.arch, "result": record.result})
        self._keep_weights(kept_before)
        line = _trial_line(record, self._slots_done(), self.candidate_budget())
        predicted = getattr(self.strategy, "predictions", {}).get(name) if kind == "candidate" else None
        line += f"  (surrogate predicted val/ne {predicted[0]:.4f} +- {predicted[1]:.4f})" if predicted else ""
        self.progress.finished(name, out.result, line)
        if out.traceback:
            log.debug("trial %s failed:\n%s", name, out.traceback)

    def _log_child(self, record: TrialRecord, history: list[dict[str, float]], start: float | None = None,
                   end: float | None = None) -> None:
        arch, result = Architecture.from_dict(record.arch), TrialResult.from_dict(record.result)
        baseline = record.name if record.kind == "baseline" else None
        choices = self.space.encode(arch)  # the space's flat labels, for MLflow's compare views
        params = {} if choices is None else {k: choices[k] for k in self.space.active(choices)}
        record.run_id = self.tracker.log_trial(self.state.parent_run_id, arch, result, _trial_tags(record),
                                               baseline=baseline, params=params, start_time=start, end_time=end,
                                               history=history)
        predicted = getattr(self.strategy, "predictions", {}).get(record.name) if record.kind == "candidate" else None
        if predicted is not None:  # what the surrogate expected of it, beside the measured val/ne
            self.tracker.log_metrics(record.run_id, {"surrogate/predicted_ne": predicted[0],
                                                     "surrogate/spread": predicted[1]})
        if result.cost is not None and result.cost.rocs_metrics():  # measured once, before training
            self.tracker.log_metrics(record.run_id, result.cost.rocs_metrics())

    def _all_trials(self) -> list[TrialRecord]:
        """This process's trials, plus (with shared storage) those every other process has finished."""
        trials = list(self.state.trials)
        if self.shared is not None:
            names = {t.name for t in trials}
            for e in self.shared.trials():
                if e["name"] not in names:
                    trials.append(TrialRecord(number=-1, kind=e["kind"], name=e["name"], arch=e["arch"],
                                              result=e["result"]))
        return trials

    def _reconcile(self) -> None:
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
            elif not self.cfg.search.storage:  # an older checkpoint: its numbers are unique in its search
                self.tracker.delete_child_runs(self.state.parent_run_id, TRIAL_TAG, str(record.number))
            self._log_child(record, [])
            save_state(self.path, self.state)

    def _start(self) -> SearchState:
        if self.shared is None:
            parent = self._new_parent()
        else:  # one parent for every process; a process of another identity is refused here
            parent, self.owner = self.shared.parent_run(self._new_parent, self.identity)
        return SearchState(parent_run_id=parent, config=to_dict(self.cfg), identity=self.identity)

    def _new_parent(self) -> str:
        parent = self.tracker.start_search(to_dict(self.cfg), self.cfg.search.strategy, self.space)
        self.tracker.log_dict(parent, self.identity, "identity.json")
        return parent

    # --- weights: the kept ones live in the MLflow artifact store only (see search.kept) --------

    def _weights_path(self, name: str) -> str:
        return self.weights.path(name)

    def _kept(self) -> list[TrialRecord]:
        """Every baseline, the ``keep_top_k`` best ok candidates by objective and the winner so far
        (a candidate that clears the noise may rank below candidates that do not). The final
        winner is the winner from its own recording on: whether a candidate beats the best
        baseline does not depend on the candidates after it."""
        ok = [t for t in self.state.candidates() if t.result["status"] == "ok"]
        ok.sort(key=lambda t: self.objective(TrialResult.from_dict(t.result)))
        kept = self.state.baselines() + ok[: self.cfg.search.keep_top_k]
        choice = self._choose(self._all_trials())
        if choice is not None and choice.winner.kind == "candidate":
            kept += [t for t in ok[self.cfg.search.keep_top_k:] if t.name == choice.winner.name]
        return kept

    def _keep_weights(self, kept_before: set[str]) -> None:
        kept = {t.name for t in self._kept()}
        self.weights.sync(self.state.trials, kept, kept_before - kept)

    # --- the end ---------------------------------------------------------------------------------

    def spending(self) -> dict[str, float]:
        """How the search's wall clock went so far (see :func:`~rankitect.search.budget.spending`)."""
        retrained = {Architecture.from_dict(d).hash for d in self.state.plan}
        return spending(self.state.trials, retrained, self.budget.spent())

    def _finish(self) -> SearchOutcome:
        self.state.done = True
        self.state.elapsed = self.budget.spent()
        save_state(self.path, self.state)
        self._keep_weights(set())  # weights a kill left behind before they reached their run
        self.tracker.log_artifact(self.state.parent_run_id, self.weights.spec_file())
        # Processes of one shared search finish into one folder and parent run: the table is read
        # and written under a lock (the storage's, across machines), so the last writer has read
        # every trial shared before it, and ranks by the target the owner published.
        with self._finish_lock(), folder_lock(self.out_dir):
            view = self.shared.view() if self.shared is not None and not self.owner else None
            if view is not None:
                self._take_view(view, echo=False)
            table, best, choice = self._pareto()
            if choice is not None:  # the winner itself closes the output (SearchOutcome.choice)
                within = self._within_target(choice)
                if within is not None:
                    self.echo(within)
            table.to_csv(self.out_dir / "pareto.csv", index=False)
            if best is not None:
                (self.out_dir / "best_genotype.json").write_text(best.to_json(indent=2) + "\n")
            rows = sum(len(self.data.split(s)) for s in ("train", "val", "test"))
            title = (f"{self.cfg.search.strategy} search, {self.cfg.search.space} space, "
                     f"{self.data.spec.name} data ({rows:,} rows)")
            spent = self.spending()
            if self.budget.seconds is not None:
                self.echo(self._budget_line(spent))
            self.tracker.log_metrics(self.state.parent_run_id, {f"budget/{k}_seconds": v for k, v in spent.items()})
            self.tracker.finish_search(self.state.parent_run_id, table, best, self.state.to_dict(),
                                       plot_title=title, floor=self.data.split("test").bayes_ne)
        return SearchOutcome(self.state.parent_run_id, table, best, self.out_dir, spent, choice)

    def _finish_lock(self) -> Any:
        from contextlib import nullcontext

        return nullcontext() if self.shared is None else self.shared.lock()

    def _budget_line(self, spent: dict[str, float]) -> str:
        """How the time budget went: minutes by what they went to, and the trials it cut short."""
        parts = ", ".join(f"{k} {spent[k] / 60:.1f}" for k in spent if k != "total" and spent[k] > 0)
        cut = [t.name for t in self.state.trials if t.result.get("stopped")]
        line = f"time budget {self.budget.seconds / 60:.1f} min: spent {spent['total'] / 60:.1f} min ({parts} min)"
        return line + (f"; stopped at the budget with their best validation: {', '.join(cut)}" if cut else "")

    def _entrant(self, kind: str, name: str, result: TrialResult) -> Entrant:
        return Entrant(name, kind, result, self.val_losses.load(name) if result.ok else None)

    def _choose(self, trials: list[TrialRecord]) -> Choice | None:
        """The winner of ``trials`` (:func:`~rankitect.search.selection.choose_winner`). Losses are
        read for the baselines and the candidates with a lower objective than every baseline only:
        no other trial can win."""
        results = [(t, TrialResult.from_dict(t.result)) for t in trials]
        bar = min((self.objective(r) for t, r in results if t.kind == "baseline"), default=math.inf)
        entrants = [self._entrant(t.kind, t.name, r) if t.kind == "baseline" or self.objective(r) < bar
                    else Entrant(t.name, t.kind, r) for t, r in results]
        return choose_winner(entrants, self.objective, self.cfg.search.min_gain_se)

    def winner_within(self, max_mflops: float) -> Choice | None:
        """The winner by the same rule among the finished trials of at most ``max_mflops`` MFLOPs:
        what the search would return under a hard cost cap, read off its Pareto table (a baseline
        over the cap neither competes nor sets the bar)."""
        def within(t: TrialRecord) -> bool:
            mflops = TrialResult.from_dict(t.result).mflops
            return at_most(mflops, max_mflops)

        return self._choose([t for t in self._all_trials() if within(t)])

    def _within_target(self, choice: Choice) -> str | None:
        """Where the winner costs more than ``search.target_mflops``: a line naming the winner
        under a hard cap at the target (:meth:`winner_within`), the Pareto table's other answer."""
        target, won = self.objective.target_mflops, choice.winner.result
        if target is None or won.mflops is None or at_most(won.mflops, target):
            return None
        within = self.winner_within(target)
        if within is None:
            return None
        w = within.winner
        return (f"at no more than target_mflops ({target:.4f} MFLOPs): {w.kind} {w.name}, "
                f"val/ne {w.result.val_ne:.4f} at {w.result.mflops:.4f} MFLOPs")

    def _pareto(self) -> tuple[pd.DataFrame, Architecture | None, Choice | None]:
        """The Pareto table of every finished trial (all processes' with shared storage), its winner
        (:func:`~rankitect.search.selection.choose_winner`) and why."""
        from rankitect.eval.pareto import pareto_table

        trials = self._all_trials()
        cands = [(Architecture.from_dict(t.arch), TrialResult.from_dict(t.result)) for t in trials
                 if t.kind == "candidate"]
        bases = [(t.name, TrialResult.from_dict(t.result)) for t in trials if t.kind == "baseline"]
        choice = self._choose(trials)
        table = pareto_table(cands, bases, objective=self.objective,
                             winner=None if choice is None else (choice.winner.kind, choice.winner.name))
        base_archs = {t.name: Architecture.from_dict(t.arch) for t in trials if t.kind == "baseline"}
        return table, _winner(table, cands, base_archs), choice


def _winner(table: pd.DataFrame, cands: list[tuple[Architecture, TrialResult]],
            bases: dict[str, Architecture]) -> Architecture | None:
    """The winning row's architecture: a candidate's by hash, a baseline's by name."""
    rows = table[table["winner"]]
    if not len(rows):
        return None
    row = rows.iloc[0]
    if row["kind"] == "baseline":
        return bases.get(row["name"])
    by_hash = {arch_hash(a): a for a, _ in cands}
    return by_hash.get(row["hash"])


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _trial_tags(record: TrialRecord) -> dict[str, str]:
    tags = {TRIAL_TAG: str(record.number)}
    if record.trial_id is not None:
        tags[TRIAL_ID_TAG] = record.trial_id
    stopped = record.result.get("stopped")
    if stopped:
        tags[STOPPED_TAG] = stopped
    return tags


def _trial_line(record: TrialRecord, n_done: int, n_total: int) -> str:
    """One finished trial. A candidate that holds a slot of the budget is ``[n/N]`` (n never past
    N: a pruned one gives its slot back and is ``[pruned]``); a baseline is ``[baseline]``."""
    r = TrialResult.from_dict(record.result)
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
