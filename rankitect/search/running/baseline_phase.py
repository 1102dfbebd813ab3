"""What a search takes from its trained baselines before its first candidate.

``search.target_mflops: auto`` (or ``cheapest``) becomes a baseline's FLOPs (see
:func:`~rankitect.search.judging.selection.auto_target`), ``search.pruning_min_validations: auto`` the first
rung at which successive halving over the baselines' curves keeps the best
(:meth:`~rankitect.search.judging.pruning.Rungs.calibrate`), and the strategy is told every trained
baseline its space holds, so it starts from them. With shared storage the search's first process
(the owner, which trains the baselines) publishes what it resolved (the *view*), and every other
process waits for it and ranks and prunes by it, so that all of them follow one rule.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rankitect.config import SearchConfig
from rankitect.errors import UserError
from rankitect.search.base import Proposer
from rankitect.search.running.checkpoint import TrialRecord
from rankitect.eval.objective import Objective
from rankitect.search.judging.pruning import Rungs
from rankitect.search.running.record import Recorder
from rankitect.search.judging.selection import TARGET_RULES, auto_target
from rankitect.search.judging.standings import Standings


class BaselinePhase:
    """Resolves the ``auto`` settings of the search ``search`` from its baselines (a process that
    is not the ``owner`` of a shared search takes them from the owner's view), ranking by the result
    in ``standings`` and ``strategy`` alike; ``recorder`` holds the trials; ``echo`` receives what
    was resolved, one line each."""

    def __init__(self, search: SearchConfig, *, recorder: Recorder, standings: Standings, strategy: Proposer,
                 rungs: Rungs | None, owner: bool, echo: Callable[[str], None]) -> None:
        self.search, self.recorder, self.standings, self.strategy = search, recorder, standings, strategy
        self.rungs, self.shared, self.owner, self.echo = rungs, recorder.shared, owner, echo

    def start(self) -> None:
        """Resolve the ``auto`` settings from the baselines (or take the owner's view, waiting for
        it), then tell the strategy every trained baseline its space holds (both idempotent on resume)."""
        view = self._wait_for_view() if self.shared is not None and not self.owner else None
        bases = [t for t in self.recorder.all_trials() if t.kind == "baseline"]
        if view is not None:
            self.take_view(view, echo=True)
        else:
            self._resolve(bases)
        taken = [t.name for t in bases if self.strategy.observe(t.arch, t.result)]
        if taken:
            self.echo(f"{self.search.strategy} starts from the baselines {', '.join(taken)}")

    def _rank_by(self, objective: Objective) -> None:
        self.standings.objective = objective
        self.strategy.objective = objective

    def _resolve(self, bases: list[TrialRecord]) -> None:
        """Resolve the ``auto`` (or ``cheapest``) target and first rung from ``bases``; with shared
        storage the owner publishes them (:meth:`~rankitect.search.running.shared_study.SharedStudy.publish_view`)
        for every other process."""
        rule, min_gain_se = self.search.target_mflops, self.search.min_gain_se
        if rule in TARGET_RULES:
            found = auto_target([self.standings.entrant(t) for t in bases], min_gain_se, self.standings.objective,
                                rule=str(rule))
            self._rank_by(self.standings.objective.with_target(found.mflops if found else None))
            self.echo(found.line(min_gain_se) if found else f"target_mflops {rule}: no baseline finished; "
                      "ranking by NE alone")
        placed = self.rungs.calibrate() if self.rungs is not None else None
        if placed is not None and placed[1] is None:
            self.echo("pruning_min_validations auto: fewer than 2 baselines finished; first rung at 1 validation")
        elif placed is not None:
            self.echo(f"pruning_min_validations auto: first rung at {placed[0]} validation{'s' * (placed[0] > 1)} "
                      f"(the earliest at which successive halving over the baselines keeps the best, {placed[1]})")
        if self.rungs is not None and self.rungs.early_note is not None:
            self.echo(f"pruning_early_rung auto: {self.rungs.early_note}")
        if self.shared is not None and self.owner:
            self.shared.publish_view({"target_mflops": self.standings.objective.target_mflops,
                                      "baselines": [b.name for b in bases],
                                      "min_validations": None if self.rungs is None else self.rungs.min_validations,
                                      "early": None if self.rungs is None else self.rungs.early})

    def take_view(self, view: dict[str, Any], *, echo: bool) -> None:
        """Rank and prune by what the search's owner resolved from the baselines."""
        rule = self.search.target_mflops
        if rule in TARGET_RULES:
            target = view["target_mflops"]
            self._rank_by(self.standings.objective.with_target(target))
            if echo:
                self.echo(f"target_mflops {rule}: " + ("no baseline finished; ranking by NE alone" if target is None
                          else f"{target:.4f} MFLOPs (from the baselines {', '.join(view['baselines'])})"))
        if self.rungs is not None and self.rungs.auto and view["min_validations"] is not None:
            self.rungs.min_validations = view["min_validations"]
            if echo:
                self.echo(f"pruning_min_validations auto: first rung at {view['min_validations']} validations")
        if self.rungs is not None and self.rungs.early_rule == "auto":
            self.rungs.early = view.get("early")

    def _wait_for_view(self) -> dict[str, Any] | None:
        """What the owner resolved from the baselines, waiting while it trains them; None when this
        process's time budget runs out first (it then resolves from what is there). A search whose
        parent run has ended before that (its owner stopped), or whose owner has not beaten for
        :data:`~rankitect.search.running.shared_study.OWNER_SILENT_S` (killed, the run left RUNNING), is an
        error saying how to go on."""
        from rankitect.search.running import shared_study
        from rankitect.track.location import store_args

        shared, tracker, parent_run_id = self.shared, self.recorder.tracker, self.recorder.state.parent_run_id
        go_on = (f"continue it with rankitect search --resume {parent_run_id}{store_args(tracker.uri)}, "
                 "then start this process again")
        view, delay, said = shared.view(), 0.2, False
        while view is None:
            status = tracker.get_run(parent_run_id).info.status
            if status != "RUNNING":
                raise UserError(f"search run {parent_run_id} is {status} before its baselines finished: {go_on}")
            silence = shared.silence()
            if silence is not None and silence > shared_study.OWNER_SILENT_S:
                raise UserError(f"search run {parent_run_id}: its first process, which trains the baselines, has "
                                f"not been heard from for {silence:.0f} s (stopped without ending the run): {go_on}")
            if self.recorder.budget.exhausted():
                return None
            if not said:
                self.echo("waiting for the search's first process to train the baselines (the ranking's target)")
                said = True
            time.sleep(delay)  # a poll of the shared storage, not an ordering of tests
            delay = min(2 * delay, 5.0)
            view = shared.view()
        return view
