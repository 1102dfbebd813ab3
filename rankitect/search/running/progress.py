"""What a running search shows: one status line for the whole search, true to its checkpoint.

:class:`SearchProgress` keeps one line over every trial of the search (baselines and candidates):
trials finished of the total, done (ok), running (with the running trial's epoch and step), pruned
and failed counts, the best validation NE so far and an ETA. The counts start from the trials the
checkpoint holds (a resumed search), so they match it. The ETA is the work left, measured: each
running trial's time to its last step at the pace of its steps so far, plus the trials not yet
started at the mean wall time of the trials finished so far (before any has finished: the
estimate given by :meth:`SearchProgress.estimate`), over the workers, and never past the time
budget left. On a terminal the line is redrawn in place and fits its width (the running trials'
details go first, so best NE and ETA stay in 80 columns); anywhere else (a log file, a pipe) it
is printed as a plain line after every finished trial and once a minute, never with a carriage
return. :class:`LineProgress` is the same interface with the trial lines only.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

HEARTBEAT_S = 2.0  # redraws on a terminal
LINE_EVERY_S = 60.0  # a status line at least this often elsewhere
LOG_WIDTH = 160  # a status line written to a log is cut here


def _clock(seconds: float) -> str:
    """``1:02:03`` or ``2:03``.

    >>> _clock(3723), _clock(123.9), _clock(-5)
    ('1:02:03', '2:03', '0:00')
    """
    m, s = divmod(int(max(seconds, 0)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


Steps = tuple[int, int, int, int]  # step, total steps, epoch (from 1), epochs; epochs 0: not epochs (a supernet)


class LineProgress:
    """No status line: finished trials and notes become lines through ``echo``; counts are kept."""

    def __init__(self, echo: Callable[[str], None] = print, *, clock: Callable[[], float] = time.time) -> None:
        self.echo, self.clock = echo, clock
        self.statuses: Counter[str] = Counter()
        self.running: dict[str, float] = {}  # name -> start (clock)
        self.steps: dict[str, Steps] = {}  # name -> where it stands, as last reported
        self.steps_files: dict[str, Path] = {}  # name -> a worker's steps file (see search.trial.StepFile)
        self.phases: set[str] = set()  # running names that are not trials (a supernet phase)
        self.best_ne: float | None = None
        self.durations: list[float] = []  # wall seconds of the trials finished in this process

    def write(self, line: str) -> None:
        self.echo(line)

    def started(self, name: str, steps_file: Path | None = None) -> None:
        """``name`` runs from now; a worker notes its steps in ``steps_file``, if given."""
        self.running[name] = self.clock()
        if steps_file is not None:
            self.steps_files[name] = Path(steps_file)

    def stepper(self, name: str) -> Callable[[int, int, int, int], None]:
        """The training step hook of ``name`` in this process (a ``train.protocol.StepHook``)."""
        def note(step: int, total: int, epoch: int, epochs: int) -> None:
            self.steps[name] = (step, total, epoch, epochs)
        return note

    def phase_stepper(self, name: str) -> Callable[[int, int], None]:
        """The step hook of a phase that has steps but no epochs (a supernet): it shows among the
        running, yet is no trial of the counts."""
        self.phases.add(name)

        def note(step: int, total: int) -> None:
            self.steps[name] = (step, total, 0, 0)
        return note

    def start_time(self, name: str) -> float | None:
        """When ``name`` started (``time.time()``), if it was announced."""
        return self.running.get(name)

    def ended(self, name: str) -> None:
        """``name`` (a phase, not a trial) stopped running; nothing is counted."""
        self.running.pop(name, None)
        self.steps.pop(name, None)
        self.phases.discard(name)
        path = self.steps_files.pop(name, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def finished(self, name: str, result: Any, line: str) -> None:
        """Count ``result`` (a ``TrialResult``) by its status and print ``line``."""
        start = self.running.get(name)
        if start is not None:
            self.durations.append(self.clock() - start)
        self.ended(name)
        self.count(result)
        self.write(line)

    def count(self, result: Any) -> None:
        self.statuses[result.status] += 1
        if result.status == "ok" and result.val_ne is not None:
            self.best_ne = result.val_ne if self.best_ne is None else min(self.best_ne, result.val_ne)

    def close(self) -> None:
        pass


class SearchProgress(LineProgress):
    """The search's status line over ``total`` trials (see the module docstring).

    Args:
        total: trials the search runs (baselines and candidates), finished ones included. A pruned
            trial gives its slot back (the search trains another in its place): the total grows by one.
        time_budget: seconds the search may take (``None``: no budget); caps the ETA.
        elapsed: seconds of the time budget spent before this process started.
        before: the results of the trials the checkpoint holds (a resumed search).
        workers: trials that run at once.
        stream: where the line goes (standard error by default); lines of trials go to standard output.
        tty: draw in place (default: when ``stream`` and standard output are terminals).
        clock: wall seconds (a fake one in tests).
    """

    def __init__(self, total: int, *, time_budget: float | None = None, elapsed: float = 0.0,
                 before: Iterable[Any] = (), workers: int = 1, stream: TextIO | None = None,
                 tty: bool | None = None, heartbeat_s: float = HEARTBEAT_S, line_every: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.time, echo: Callable[[str], None] | None = None) -> None:
        super().__init__(echo or (lambda line: print(line, flush=True)), clock=clock)
        self.stream = stream or sys.stderr
        self.tty = (_isatty(self.stream) and _isatty(sys.stdout)) if tty is None else tty
        for result in before:
            self.count(result)
        self.total = total + self.statuses.get("pruned", 0)
        self.time_budget, self.elapsed_before, self.workers = time_budget, elapsed, max(1, workers)
        self.t0 = clock()
        self.per_trial: float | None = None  # seconds a trial takes, estimated before any finished
        self.line_every, self._last_line = line_every, self.t0
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True)
        self.beat.start()

    # --- what happens ----------------------------------------------------------------------------

    def write(self, line: str) -> None:
        with self.lock:
            self._clear()
            super().write(line)
            self._draw()

    def started(self, name: str, steps_file: Path | None = None) -> None:
        with self.lock:
            super().started(name, steps_file)
            self._draw()

    def estimate(self, seconds_per_trial: float) -> None:
        """Seconds a trial takes, before any has finished (see :func:`~rankitect.search.proposing.estimate`)."""
        self.per_trial = seconds_per_trial

    def finished(self, name: str, result: Any, line: str) -> None:
        with self.lock:
            if result.status == "pruned":
                self.total += 1
            super().finished(name, result, line)
            if not self.tty:
                self._line()

    # --- what it says ----------------------------------------------------------------------------

    def finished_count(self) -> int:
        return sum(self.statuses.values())

    def status(self, width: int, now: float | None = None) -> str:
        """The status line, at most ``width`` characters: the running trials' details are dropped
        first, then words are shortened; counts, best NE and ETA stay."""
        now = self.clock() if now is None else now
        self._read_steps_files()
        n = min(self.finished_count(), self.total)
        eta = self.eta(now)
        best = None if self.best_ne is None else f"{self.best_ne:.4f}"
        left = "" if eta is None else f"ETA {_clock(eta)}"
        p, f = self.statuses.get("pruned", 0), self.statuses.get("failed", 0)
        ok, run = self.statuses.get("ok", 0), len(set(self.running) - self.phases)
        details = [self._detail(name, now) for name in self.running]
        for i in range(len(details), -1, -1):  # all details, then fewer, then none
            shown = f" ({', '.join(details[:i])})" if i else ""
            line = ", ".join(x for x in (f"search {n}/{self.total}: done {ok}", f"running {run}{shown}",
                                         f"pruned {p}", f"failed {f}", best and f"best val/ne {best}", left) if x)
            if len(line) <= width:
                return line
        short = " ".join(x for x in (f"{n}/{self.total}", best and f"best {best}", left,
                                     f"ok {ok} run {run} pruned {p} failed {f}") if x)
        return short[:width]  # a narrow terminal: best NE and ETA before the counts

    def _detail(self, name: str, now: float) -> str:
        age = f"{now - self.running[name]:.0f}s"
        steps = self.steps.get(name)
        if steps is None:
            return f"{name[:12]} {age}"
        step, total, epoch, epochs = steps
        where = f"epoch {epoch}/{epochs} step {step}/{total}" if epochs else f"step {step}/{total}"
        return f"{name[:12]} {where} {age}"

    def eta(self, now: float) -> float | None:
        """Seconds left (see the module docstring); ``None`` when nothing measured says yet."""
        mean = sum(self.durations) / len(self.durations) if self.durations else self.per_trial
        work = 0.0
        for name, start in self.running.items():
            age, steps = now - start, self.steps.get(name)
            if steps is not None and steps[0] > 0:
                work += age * (steps[1] - steps[0]) / steps[0]
            elif mean is not None:
                work += max(0.0, mean - age)
            else:
                return self._capped(None, now)
        unstarted = max(0, self.total - self.finished_count() - len(set(self.running) - self.phases))
        if unstarted and mean is None:
            return self._capped(None, now)
        guess = (work + unstarted * (mean or 0.0)) / self.workers
        return self._capped(guess, now)

    def _capped(self, guess: float | None, now: float) -> float | None:
        if self.time_budget is None:
            return guess
        budget_left = max(0.0, self.time_budget - self.elapsed_before - (now - self.t0))
        return budget_left if guess is None else min(guess, budget_left)

    def _read_steps_files(self) -> None:
        from rankitect.search.running.trial import read_steps

        for name, path in list(self.steps_files.items()):
            steps = read_steps(path)
            if steps is not None:
                self.steps[name] = steps

    # --- drawing ---------------------------------------------------------------------------------

    def _width(self) -> int:
        return shutil.get_terminal_size((80, 24)).columns - 1 if self.tty else LOG_WIDTH

    def _draw(self) -> None:
        if self.tty and not self.stop.is_set():
            self.stream.write("\r\x1b[K" + self.status(self._width()))
            self.stream.flush()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _line(self) -> None:
        self._last_line = self.clock()
        super().write(self.status(self._width()))

    def tick(self) -> None:
        """What the heartbeat does: redraw on a terminal; elsewhere a line once ``line_every`` passed."""
        with self.lock:
            if self.tty:
                self._draw()
            elif self.clock() - self._last_line >= self.line_every:
                self._line()

    def _heartbeat(self, every: float) -> None:
        while not self.stop.wait(every):
            self.tick()

    def close(self) -> None:
        self.stop.set()
        self.beat.join()
        with self.lock:
            if self.tty:
                self.stream.write("\r\x1b[K" + self.status(self._width()) + "\n")
                self.stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class TrainingProgress:
    """The progress of one training (``rankitect finetune``), a ``train.protocol.StepHook``: epoch
    and step of the known total, the time so far and an ETA at the pace of the steps so far; redrawn
    in place on a terminal (at most every ``redraw_s``), elsewhere a plain line once ``line_every``
    seconds passed.

    Args:
        what: the name the line starts with.
        stream: where the line goes (standard error by default).
        tty: draw in place (default: when ``stream`` is a terminal).
        clock: wall seconds (a fake one in tests).
    """

    def __init__(self, what: str, *, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.time, redraw_s: float = 0.5,
                 line_every: float = LINE_EVERY_S) -> None:
        self.what, self.stream, self.clock = what, stream or sys.stderr, clock
        self.tty = _isatty(self.stream) if tty is None else tty
        self.every = redraw_s if self.tty else line_every
        self.t0 = clock()
        self._last = self.t0
        self.line = ""

    def __call__(self, step: int, total: int, epoch: int, epochs: int) -> None:
        now = self.clock()
        self.line = self.status(step, total, epoch, epochs, now)
        if now - self._last >= self.every or step >= total:
            self._last = now
            self.stream.write(f"\r\x1b[K{self.line}" if self.tty else self.line + "\n")
            self.stream.flush()

    def status(self, step: int, total: int, epoch: int, epochs: int, now: float) -> str:
        """``finetune epoch 2/4, step 120/376 (32%), 0:42, ETA 1:29``."""
        took = now - self.t0
        eta = f", ETA {_clock(took * (total - step) / step)}" if step else ""
        return (f"{self.what} epoch {epoch}/{epochs}, step {step}/{total} ({100 * step // max(1, total)}%), "
                f"{_clock(took)}{eta}")

    def close(self) -> None:
        if self.tty and self.line:
            self.stream.write("\n")
            self.stream.flush()
