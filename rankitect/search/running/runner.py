"""The search runner: one loop, propose -> train and score -> record, for every strategy.

``SearchRunner(cfg).run()`` trains (or reuses: :mod:`~rankitect.search.running.reuse`) the
hand-designed baselines under the search's budget, resolves what they decide
(:mod:`~rankitect.search.running.baseline_phase`), starts the strategy (a
:class:`~rankitect.search.base.Proposer` from the one registry; ``oneshot`` and ``dnas`` train their
supernet here), then trains what it proposes until its budget (``search.trials``, or a supernet's
``top_k``) has finished, across every process sharing ``search.storage``
(:mod:`~rankitect.search.running.shared_study`), in a pool of ``search.workers`` processes or in
this one (:mod:`~rankitect.search.running.launch`). Every finished trial is recorded at once
(checkpoint, child run, kept weights: :mod:`~rankitect.search.running.record`); ``resume(run_id)``
continues a killed search exactly where its checkpoint stands. A candidate that fails becomes a
FAILED child run. At the end the verdict, on validation rows nothing else read, chooses the winner
(:mod:`~rankitect.search.judging.verdict`), and the Pareto table comes from
:mod:`~rankitect.search.judging.standings`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from rankitect.config import Config, config_from_dict

from rankitect.config_rules import rename_old_keys
from rankitect.errors import UserError
from rankitect.eval.metrics import entropy
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Proposer, SearchContext, SpaceExhausted, arch_hash
from rankitect.search.running.baseline_phase import BaselinePhase
from rankitect.search.running.budget import TimeBudget, TrialSlots, parse_duration, spending
from rankitect.search.running.checkpoint import SearchState, check_writable, folder_lock, load_state, process_key, save_state
from rankitect.search.factory import check_names, objective_from_config, strategy_from_config
from rankitect.search.running.identity import check_identity, config_identity, data_identity, search_identity
from rankitect.search.running.kept import KeptWeights
from rankitect.search.running.launch import Launcher, WorkerPlan, plan_workers
from rankitect.search.proposing.plan_proposer import PlanProposer
from rankitect.search.running.progress import LineProgress
from rankitect.search.running.record import Recorder, end_failed, open_parent, record_verdict
from rankitect.search.running.reuse import BaselineStore
from rankitect.search.judging.verdict import Verdict
from rankitect.search.running.shared_study import SharedStudy, owner_heartbeat
from rankitect.search.judging.standings import Standings, ExampleLosses
from rankitect.track.names import CHECKPOINT as CHECKPOINT_TAG
from rankitect.signals import StopGuard, Stopped, stop_on_signals
from rankitect.space.architecture import Architecture

log = logging.getLogger(__name__)


@dataclass
class SearchOutcome:
    parent_run_id: str
    table: pd.DataFrame
    best: Architecture | None
    out_dir: Path
    spending: dict[str, float] | None = None  # seconds by what they went to (see rankitect.search.running.budget)
    verdict: Verdict | None = None  # the winner and why: the closing lines (Verdict.lines)


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
    from rankitect.track.location import SQLITE, resolve_uri

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
        from rankitect.search.proposing.sizing import space_for
        from rankitect.space.baselines import with_history_baselines
        from rankitect.track import Tracker
        from rankitect.train.protocol import Schedule, check_warmup

        check_names(cfg.search)  # before the data set is opened (and maybe cached)
        check_paths(cfg)  # before anything is read, created or written
        self.cfg, self.echo = cfg, echo
        self.plan: WorkerPlan = plan_workers(cfg, echo)  # who trains the trials
        self.progress = LineProgress(echo)  # see watch()
        budget_seconds = parse_duration(cfg.search.time_budget)  # config errors before any data is read
        check_warmup(cfg.train)
        self.guard = StopGuard()  # replaced by the installed one while ``run`` runs
        self.train_cfg = replace(cfg.train, progress=False)  # one line per trial instead of bars
        # processes sharing search.storage coordinate through it (rankitect.search.running.shared_study)
        # (a storage without a study name is the strategy's config error, below)
        shared = cfg.search.storage is not None and cfg.search.study_name
        self.shared = SharedStudy(cfg.search.storage, cfg.search.study_name) if shared else None
        # a config that differs: refused before the data is read
        check_identity(config_identity(cfg), state, self.shared)
        self.data = open_data(cfg.data.source, cfg.data, progress=_isatty(sys.stderr))  # no carriage returns in a log
        self.identity = search_identity(cfg, self.data)
        # the validation rows held out for the final choice (rankitect.search.judging.verdict); every
        # other part of the search sees the rest as the validation split
        self.data = self.data.with_verdict(cfg.search.verdict.fraction)
        check_identity(self.identity, state, self.shared)
        # DIN and BST join the default baselines on data with a history (the identity keeps the list as given)
        self.cfg = replace(cfg, search=replace(cfg.search, baselines=with_history_baselines(cfg.search.baselines,
                                                                                            self.data.spec)))
        check_warmup(cfg.train, Schedule.for_data(cfg.train, self.data).total_steps)
        self.space = space_for(cfg.search.space, self.data.spec, cfg.search.flops_range, rocs=cfg.search.rocs)
        objective = objective_from_config(cfg.search)
        self.strategy: Proposer = strategy_from_config(cfg.search, self.space)  # proposes every candidate
        self.tracker = Tracker(cfg.track.uri, cfg.track.experiment)
        self.owner = True  # created the parent run (with shared storage, one process does)
        opened = state is None
        if opened:
            state, self.owner = open_parent(cfg, self.tracker, self.space, self.identity, self.shared)
        elif state.strategy:
            self.strategy.load_state_dict(state.strategy)
        self.state = state
        try:
            self._open(objective, budget_seconds, clock)
        except BaseException as e:
            if opened and self.owner:  # the run this process opened ends with the reason
                end_failed(self.tracker, self.state.parent_run_id, e)
            raise

    def _open(self, objective: Objective, budget_seconds: float | None, clock: Callable[[], float]) -> None:
        """The rest of the constructor, once the parent run exists: folder, checkpoint, recorder."""
        cfg = self.cfg
        self.out_dir = search_dir(cfg, self.tracker.uri, self.state.parent_run_id)
        # With shared storage the processes share the parent run and its folder: the owner keeps
        # ``state.json`` (what --resume finds), every other process a checkpoint of its own.
        self.path = self.out_dir / ("state.json" if self.owner else f"state-{process_key()}.json")
        tag = CHECKPOINT_TAG if self.owner else f"{CHECKPOINT_TAG}.{process_key()}"
        self.tracker.set_tag(self.state.parent_run_id, tag, str(self.path))
        self.budget = TimeBudget(budget_seconds, clock=clock, elapsed=self.state.elapsed)
        search = cfg.search
        self.slots = TrialSlots(self.strategy, search.trials, shared=self.shared,
                                reduction=search.pruning_reduction if search.pruning != "none" else None)
        # per-example validation losses: the winner's paired test
        held = self.data.split("verdict") if self.data.has_verdict else None
        self.standings = Standings(objective, search.min_gain_se, ExampleLosses(self.out_dir), verdict=search.verdict,
                                   held_entropy=None if held is None else entropy(held.ctr),
                                   held_clicks=None if held is None else round(held.ctr * len(held)))
        # baselines trained before on the same data, recipe and protocol (rankitect.search.running.reuse)
        self.reuse = None if not search.reuse_baselines else BaselineStore(
            self.tracker, self.out_dir, data_identity=data_identity(self.data), train=self.train_cfg,
            verdict_fraction=search.verdict.fraction)
        self.recorder = Recorder(self.state, self.path, tracker=self.tracker, space=self.space, strategy=self.strategy,
                                 shared=self.shared, weights=KeptWeights(self.tracker, self.out_dir, self.data.spec),
                                 standings=self.standings, keep_top_k=search.keep_top_k, budget=self.budget)
        save_state(self.path, self.state)

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
        """Report to ``progress`` (e.g. a :class:`~rankitect.search.running.progress.SearchProgress` bar)."""
        self.progress, self.echo = progress, progress.write

    def finished_results(self) -> list[TrialResult]:
        """The results of the trials this process's checkpoint holds (what a progress display starts from)."""
        return [t.result for t in self.state.trials]

    def estimate(self) -> Any:
        """How long the trials left will take, from the baselines timed here
        (:func:`~rankitect.search.proposing.estimate.estimate_search`); ``None`` without baselines to time."""
        from rankitect.search.proposing.estimate import estimate_search
        from rankitect.space.baselines import get_baseline

        if self.state.done or not self.cfg.search.baselines:
            return None
        left = self.trial_budget() - len([t for t in self.state.trials if not t.result.pruned])
        try:
            archs = {n: get_baseline(n, self.data.spec) for n in self.cfg.search.baselines}
            return estimate_search(archs, self.data, self.train_cfg, trials_left=left, workers=self.plan.workers,
                                   threads=self.plan.threads,
                                   budget_left=self.budget.left(), supernet=isinstance(self.strategy, PlanProposer))
        except Exception as e:  # noqa: BLE001 - an estimate never stops a search; its trials report their faults
            log.debug("no estimate: %s: %s", type(e).__name__, e)
            return None

    def trial_budget(self) -> int:
        """Trials this search runs in all (baselines and candidates): the progress bar's total."""
        return (len(self.cfg.search.baselines) if self.owner else 0) + self.candidate_budget()

    def candidate_budget(self) -> int:
        """How many candidates the search trains (:meth:`~rankitect.search.running.budget.TrialSlots.budget`)."""
        return self.slots.budget()

    def run(self) -> SearchOutcome:
        """Run the search to its end; SIGTERM or SIGINT stop it cleanly (see
        :meth:`~rankitect.search.running.record.Recorder.stop`) and raise :class:`~rankitect.signals.Stopped`
        (exit status 128 + the signal)."""
        from rankitect.track.location import store_args

        launcher = Launcher(self.cfg, self.data, self.out_dir, train_cfg=self.train_cfg, weights=self.recorder.weights,
                            budget=self.budget, progress=self.progress, running=self.recorder.running, plan=self.plan)
        with stop_on_signals() as self.guard:
            try:
                self.recorder.reconcile(self.cfg.search.storage)
                launcher.open_rungs(self.cfg)
                phase = BaselinePhase(self.cfg.search, recorder=self.recorder, standings=self.standings,
                                      strategy=self.strategy, rungs=launcher.rungs, owner=self.owner, echo=self.echo)
                with owner_heartbeat(self.shared if self.owner else None):  # processes waiting for the view hear it
                    self._run_baselines(launcher)
                    phase.start()
                self._start_strategy()
                self._run_candidates(launcher)
                return self._finish(phase)
            except Stopped as stop:
                launcher.abort()
                with self.guard.deferred():
                    self.echo(self.recorder.stop(stop, store_args(self.tracker.uri), owner=self.owner))
                raise
            except Exception as e:  # refused or broken: the run ends FAILED with the reason, not RUNNING
                launcher.abort()
                if self.owner:
                    with self.guard.deferred():
                        end_failed(self.tracker, self.state.parent_run_id, e)
                raise
            finally:
                launcher.close()

    def _run_baselines(self, launcher: Launcher) -> None:
        """Train the baselines under the same budget (once per search: by the parent's owner), at
        most ``search.workers`` at once, each recorded (checkpoint, child run) as soon as it
        finishes: a kill loses at most the ones running. None starts once the time budget is
        spent; a running one stops at it (see :meth:`~rankitect.search.running.budget.TimeBudget.deadline`)."""
        from rankitect.space.baselines import get_baseline

        if not self.owner:
            return
        done = {t.name for t in self.state.baselines()}
        todo = [n for n in self.cfg.search.baselines if n not in done]
        pending: dict[Future, tuple[str, Architecture]] = {}
        while todo or pending:
            while todo and len(pending) < self.plan.workers and not self.budget.exhausted():
                name = todo.pop(0)
                arch = get_baseline(name, self.data.spec)
                if not self._reuse_baseline(name, arch, launcher):
                    pending[launcher.submit("baseline", name, arch, prune=False)] = (name, arch)
            if not pending:
                if todo:  # none could start: the budget is spent (reused ones need none)
                    self.echo(f"time budget spent ({self.budget.words()}): baseline{'s' * (len(todo) > 1)} "
                              f"{', '.join(todo)} not trained (--resume with a larger search.time_budget trains "
                              "them)")
                return
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                name, arch = pending.pop(future)
                self._record("baseline", name, arch, launcher.output(future))

    def _reuse_baseline(self, name: str, arch: Architecture, launcher: Launcher) -> bool:
        """Record baseline ``name`` from a run of the same data, recipe, seed and protocol in the run
        store, where there is one (said, tagged, entered in the rung study); whether it was."""
        found = None if self.reuse is None else self.reuse.find(arch, self.recorder.weights.path(name))
        if found is None:
            return False
        launcher.replay(name, found[1])
        self.echo(f"[baseline] {name}: reused from run {found[0]} (the same data, recipe, seed and protocol; "
                  "search.reuse_baselines=false trains it again)")
        self._record("baseline", name, arch, found[1], reused_from=found[0])
        return True

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
        self.recorder.checkpoint()

    def _run_candidates(self, launcher: Launcher) -> None:
        pending: dict[Future, Architecture] = {}
        exhausted = False
        while True:
            while (not exhausted and len(pending) < self.plan.workers
                   and self.slots.left(self.state.candidates(), len(pending)) > 0):
                if self.budget.exhausted():
                    self.echo(f"time budget spent ({self.budget.words()}): no new candidate starts")
                    exhausted = True
                    break
                try:
                    arch = self.strategy.ask()
                except SpaceExhausted as e:
                    self.echo(f"search space exhausted: {e}")
                    exhausted = True
                    break
                if not self.slots.claim(arch_hash(arch)):
                    exhausted = True  # another process took the last trial at the same moment
                    break
                pending[launcher.submit("candidate", arch_hash(arch), arch, prune=self.strategy.prunable)] = arch
            if not pending:
                return
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in finished:
                arch = pending.pop(future)
                out = launcher.output(future)
                self.strategy.tell(arch, out.result)
                self._record("candidate", arch_hash(arch), arch, out)

    def _record(self, kind: str, name: str, arch: Architecture, out: Any, reused_from: str | None = None) -> None:
        """Record the finished trial and show its line (a signal arriving meanwhile stops the search
        once the trial is written); an ok baseline's run keeps what a later search reuses of it."""
        with self.guard.deferred():
            record = self.recorder.record(kind, name, arch, out, out.started or self.progress.start_time(name),
                                          reused_from=reused_from)
            if kind == "baseline" and out.result.ok and self.reuse is not None and record.run_id:
                self.reuse.keep(record.run_id, arch, out, reused_from=reused_from)
            self.progress.finished(name, out.result, self.recorder.line(record, self.candidate_budget()))
            if out.traceback:
                log.debug("trial %s failed:\n%s", name, out.traceback)

    def _finish(self, phase: BaselinePhase) -> SearchOutcome:
        self.state.done = True
        self.recorder.checkpoint()
        self.recorder.keep_weights()  # weights a kill left behind before they reached their run
        self.tracker.log_artifact(self.state.parent_run_id, self.recorder.weights.spec_file())
        # Processes of one shared search finish into one folder and parent run: the table is read
        # and written under a lock (the storage's, across machines), so the last writer has read
        # every trial shared before it, and ranks by the target the owner published.
        with nullcontext() if self.shared is None else self.shared.lock(), folder_lock(self.out_dir):
            view = self.shared.view() if self.shared is not None and not self.owner else None
            if view is not None:
                phase.take_view(view, echo=False)
            trials = self.recorder.all_trials()
            started = time.perf_counter()
            table, best, verdict = self.standings.pareto(trials)
            if verdict is not None:  # the winner itself closes the output (SearchOutcome.verdict)
                within = self.standings.within_target(trials, verdict)
                if within is not None:
                    self.echo(within)
                record_verdict(self.tracker, self.state.parent_run_id, self.out_dir, verdict, trials,
                               seconds=time.perf_counter() - started, entropy=self.standings.held_entropy,
                               search_seconds=self.budget.spent())
            table.to_csv(self.out_dir / "pareto.csv", index=False)
            if best is not None:
                (self.out_dir / "best_genotype.json").write_text(best.to_json(indent=2) + "\n")
            rows = sum(len(self.data.split(s)) for s in ("train", "val", "test"))
            title = (f"{self.cfg.search.strategy} search, {self.cfg.search.space} space, "
                     f"{self.data.spec.name} data ({rows:,} rows)")
            retrained = {Architecture.from_dict(d).hash for d in self.state.plan}
            spent = spending(self.state.trials, retrained, self.budget.spent())
            if self.budget.seconds is not None:
                self.echo(self.budget.line(spent, [t.name for t in self.state.trials if t.result.stopped]))
            self.tracker.log_metrics(self.state.parent_run_id, {f"budget/{k}_seconds": v for k, v in spent.items()})
            self.tracker.finish_search(self.state.parent_run_id, table, best, self.state.to_dict(),
                                       plot_title=title, floor=self.data.split("test").bayes_ne)
        return SearchOutcome(self.state.parent_run_id, table, best, self.out_dir, spent, verdict)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
