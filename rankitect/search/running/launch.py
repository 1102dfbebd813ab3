"""Starting a search's trials and collecting what they return.

A :class:`Launcher` trains in this process (:class:`~rankitect.search.running.trial.InlineRunner`) or in a
local pool of ``search.workers`` processes (:class:`~rankitect.search.running.trial.TrialPool`), as
:func:`worker_plan` resolves it (``auto``: one worker per core, at most :data:`MAX_AUTO_WORKERS`, the
cores shared out as torch threads). Every trial
reports its validations to the rung study of successive halving where ``search.pruning`` is on
(:class:`~rankitect.search.judging.pruning.Rungs`), leaves its weights where the recorder picks them up
(:class:`~rankitect.search.running.kept.KeptWeights`), stops at the time budget's deadline, and shows its
steps in the search's progress display (a pool's workers through a steps file the display reads).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankitect.config import Config
from rankitect.search.running.budget import TimeBudget
from rankitect.search.running.kept import KeptWeights
from rankitect.search.running.progress import LineProgress
from rankitect.search.judging.pruning import Rungs, RungTicket
from rankitect.search.running.trial import InlineRunner, StepFile, TrialOutput, TrialPool, trial_output
from rankitect.space.architecture import Architecture


# A search trains small models: one per core trains faster than one model on every core (torch's
# intra-op threads scale poorly below a few MFLOPs per example: docs/benchmarks.md, "Speed"). More
# than a few at once also means proposals made before the results they could learn from.
MAX_AUTO_WORKERS = 4


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class WorkerPlan:
    """How a search trains its trials: ``workers`` processes (1: in the search's own process) of
    ``threads`` torch threads each."""

    workers: int
    threads: int

    def words(self) -> str:
        """``2 workers x 1 thread``, ``1 process x 2 threads``.

        >>> WorkerPlan(2, 1).words(), WorkerPlan(1, 2).words()
        ('2 workers x 1 thread', '1 process x 2 threads')
        """
        who = f"{self.workers} workers" if self.workers > 1 else "1 process"
        return f"{who} x {self.threads} thread{'s' * (self.threads != 1)}"


def worker_plan(workers: int | str, threads: int, cores: int | None = None) -> WorkerPlan:
    """``search.workers`` and ``runtime.threads`` resolved on a machine of ``cores`` usable cores
    (default: :func:`usable_cores`): ``auto`` is one worker per core, at most
    :data:`MAX_AUTO_WORKERS`; threads 0 shares the cores out among the workers (all of them for
    trials in the search's own process).

    >>> worker_plan("auto", 0, cores=2), worker_plan("auto", 0, cores=16), worker_plan(1, 0, cores=2)
    (WorkerPlan(workers=2, threads=1), WorkerPlan(workers=4, threads=4), WorkerPlan(workers=1, threads=2))
    >>> worker_plan(3, 2, cores=2)
    WorkerPlan(workers=3, threads=2)
    """
    cores = usable_cores() if cores is None else cores
    n = min(cores, MAX_AUTO_WORKERS) if workers == "auto" else int(workers)
    if n < 1:
        raise ValueError(f"search.workers must be >= 1 or 'auto', got {workers!r}")
    return WorkerPlan(n, threads if threads > 0 else max(1, cores // n))


def plan_workers(cfg: Config, echo: Callable[[str], None]) -> WorkerPlan:
    """``search.workers`` and ``runtime.threads`` on this machine; one process where spawned workers
    could not run the trials (:func:`~rankitect.search.running.trial.in_process_only`), said to ``echo``."""
    from rankitect.search.running.trial import in_process_only

    plan = worker_plan(cfg.search.workers, cfg.runtime.threads)
    why = in_process_only() if plan.workers > 1 else None
    if why is not None:
        echo(f"trials run in this process, not in {plan.workers} workers: {why}")
        plan = worker_plan(1, cfg.runtime.threads)
    return plan


class Launcher:
    """Trains the trials of one search run; ``running`` (the recorder's) notes each until it is
    recorded."""

    def __init__(self, cfg: Config, data: Any, out_dir: Path, *, train_cfg: Any, weights: KeptWeights,
                 budget: TimeBudget, progress: LineProgress, running: dict[str, tuple[str, Architecture]],
                 plan: WorkerPlan) -> None:
        self.out_dir, self.weights, self.budget = out_dir, weights, budget
        self.progress, self.running = progress, running
        self.train_cfg = train_cfg  # the candidates' training settings
        if plan.workers > 1:
            self.runner: InlineRunner | TrialPool = TrialPool(str(data.path), plan.workers, plan.threads,
                                                              memory_budget=cfg.runtime.memory_budget,
                                                              verdict=cfg.search.verdict.fraction)
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
                               rule=search.pruning, early=search.pruning_early_rung)

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

    def replay(self, name: str, out: TrialOutput) -> None:
        """Enter a baseline trained elsewhere (reused) in the rung study, as if it had trained here."""
        if self.rungs is not None:
            self.rungs.replay(name, [h["val/ne"] for h in out.history if "val/ne" in h], out.result, out.probe_ne)

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
