"""Starting a search's trials and collecting what they return.

A :class:`Launcher` trains in this process (:class:`~rankitect.search.running.trial.InlineRunner`) or in a
local pool of ``search.workers`` processes (:class:`~rankitect.search.running.trial.TrialPool`). Every trial
reports its validations to the rung study of successive halving where ``search.pruning`` is on
(:class:`~rankitect.search.judging.pruning.Rungs`), leaves its weights where the recorder picks them up
(:class:`~rankitect.search.running.kept.KeptWeights`), stops at the time budget's deadline, and shows its
steps in the search's progress display (a pool's workers through a steps file the display reads).
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rankitect.config import Config
from rankitect.search.running.budget import TimeBudget
from rankitect.search.running.kept import KeptWeights
from rankitect.search.running.progress import LineProgress
from rankitect.search.judging.pruning import Rungs, RungTicket
from rankitect.search.running.trial import InlineRunner, StepFile, TrialOutput, TrialPool, trial_output
from rankitect.space.architecture import Architecture


class Launcher:
    """Trains the trials of one search run; ``running`` (the recorder's) notes each until it is
    recorded."""

    def __init__(self, cfg: Config, data: Any, out_dir: Path, *, train_cfg: Any, weights: KeptWeights,
                 budget: TimeBudget, progress: LineProgress, running: dict[str, tuple[str, Architecture]]) -> None:
        search = cfg.search
        self.out_dir, self.weights, self.budget = out_dir, weights, budget
        self.progress, self.running = progress, running
        self.train_cfg = train_cfg  # the candidates' training settings
        if search.workers > 1:
            self.runner: InlineRunner | TrialPool = TrialPool(str(data.path), search.workers,
                                                              memory_budget=cfg.runtime.memory_budget)
        else:
            self.runner = InlineRunner(data, memory_budget=cfg.runtime.memory_budget)
        self.rungs: Rungs | None = None  # see open_rungs
        self._tickets: dict[Future, RungTicket | None] = {}

    def open_rungs(self, cfg: Config) -> None:
        """The rung study of successive halving (``search.pruning``: asha or hyperband), see
        :mod:`~rankitect.search.judging.pruning`."""
        search = cfg.search
        if search.pruning != "none":
            self.rungs = Rungs(search.storage, search.study_name, self.out_dir / "rungs.journal",
                               reduction=search.pruning_reduction, min_validations=search.pruning_min_validations,
                               rule=search.pruning)

    def submit(self, kind: str, name: str, arch: Architecture, *, prune: bool) -> Future:
        """Start training ``arch`` (reporting to the rung study, where pruning is
        on), noting it as running until it is recorded."""
        self.running[name] = (kind, arch)
        ticket = self.rungs.ticket(name, prune=prune) if self.rungs is not None else None
        if isinstance(self.runner, TrialPool):  # the worker notes its steps in a file the display reads
            steps_file = self.out_dir / "running" / f"{name}.json"
            steps_file.parent.mkdir(parents=True, exist_ok=True)
            steps_file.unlink(missing_ok=True)
            self.progress.started(name, steps_file=steps_file)
            on_step: Any = StepFile(str(steps_file))
        else:
            self.progress.started(name)
            on_step = self.progress.stepper(name)
        future = self.runner.submit(arch, self.train_cfg, self.weights.path(name), ticket,
                                    deadline=self.budget.deadline(), on_step=on_step)
        self._tickets[future] = ticket
        return future

    def output(self, future: Future) -> TrialOutput:
        """A finished future's output; its rung-study trial is closed with the result."""
        out = trial_output(future)
        ticket = self._tickets.pop(future, None)
        if ticket is not None and self.rungs is not None:
            self.rungs.close(ticket, out.result)
        return out

    def abort(self) -> None:
        self.runner.abort()

    def close(self) -> None:
        self.runner.close()
