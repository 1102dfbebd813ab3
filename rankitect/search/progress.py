"""What a running search shows: one bar for the whole search, a heartbeat of the running trials.

:class:`SearchProgress` draws one tqdm bar over every trial of the search (baselines and
candidates): trials done, running, pruned and failed (counted by ``TrialResult.status``, whatever
statuses exist), the best validation NE so far, and an ETA from the mean trial time so far,
capped by the search's time budget when it has one. A heartbeat thread refreshes the running
trials' ages every few seconds, so a candidate training for minutes is never silent. Lines
(``write``) print above the bar. :class:`LineProgress` is the same interface with lines only.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

HEARTBEAT_S = 2.0


def _clock(seconds: float) -> str:
    m, s = divmod(int(max(seconds, 0)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class LineProgress:
    """No bar: finished trials and notes become lines through ``echo``; counts are still kept."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self.echo = echo
        self.statuses: Counter[str] = Counter()
        self.running: dict[str, float] = {}
        self.best_ne: float | None = None

    def write(self, line: str) -> None:
        self.echo(line)

    def started(self, name: str) -> None:
        self.running[name] = time.time()

    def start_time(self, name: str) -> float | None:
        """When ``name`` started (``time.time()``), if it was announced."""
        return self.running.get(name)

    def finished(self, name: str, result: Any, line: str) -> None:
        """Count ``result`` (a ``TrialResult``) by its status and print ``line``."""
        self.running.pop(name, None)
        self.statuses[result.status] += 1
        if result.status == "ok" and result.val_ne is not None:
            self.best_ne = result.val_ne if self.best_ne is None else min(self.best_ne, result.val_ne)
        self.write(line)

    def close(self) -> None:
        pass


class SearchProgress(LineProgress):
    """A tqdm bar over ``total`` trials on ``stream`` (see the module docstring).

    Args:
        total: trials the search runs (baselines and candidates).
        time_budget: seconds the search may take (``None``: no budget); caps the ETA.
        done: trials finished before this process started (a resumed search).
        elapsed: seconds of the time budget spent before this process started.

    A pruned trial gives its slot back (the search trains another in its place): the total grows by one.
    """

    def __init__(self, total: int, *, time_budget: float | None = None, done: int = 0, elapsed: float = 0.0,
                 stream: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        from tqdm import tqdm

        super().__init__()
        self.total, self.time_budget, self.done_before = total, time_budget, done
        self.t0, self.elapsed_before = time.time(), elapsed
        self.lock = threading.RLock()
        self.bar = tqdm(total=total, initial=done, file=stream or sys.stderr, unit="trial", dynamic_ncols=True,
                        bar_format="search {n_fmt}/{total_fmt} |{bar:20}| {elapsed}{postfix}")
        self.stop = threading.Event()
        self.beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True)
        self.beat.start()

    def write(self, line: str) -> None:
        with self.lock:
            self.bar.write(line)

    def started(self, name: str) -> None:
        with self.lock:
            super().started(name)
            self._refresh()

    def finished(self, name: str, result: Any, line: str) -> None:
        with self.lock:
            super().finished(name, result, line)
            if result.status == "pruned":
                self.bar.total += 1
                self.total += 1
            self.bar.update(1)
            self._refresh()

    def postfix(self, now: float | None = None) -> str:
        """``done 3, running 1 (a1b2c3 42s), pruned 0, failed 1, best val/ne 0.9111, ETA 2:10``."""
        now = time.time() if now is None else now
        counts = {"done": self.statuses.get("ok", 0), "running": len(self.running)}
        counts |= {s: self.statuses.get(s, 0) for s in ("pruned", "failed")}
        counts |= {s: n for s, n in self.statuses.items() if s not in ("ok", "pruned", "failed")}
        parts = [f"{k} {n}" for k, n in counts.items()]
        if self.running:
            parts[1] += " (" + ", ".join(f"{k} {now - t:.0f}s" for k, t in list(self.running.items())[:3]) + ")"
        if self.best_ne is not None:
            parts.append(f"best val/ne {self.best_ne:.4f}")
        eta = self.eta(now)
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        return ", ".join(parts)

    def eta(self, now: float) -> float | None:
        """Seconds left: trials left times the mean seconds per trial so far, at most the time budget left."""
        finished = sum(self.statuses.values())
        left = self.total - self.done_before - finished
        guess = (now - self.t0) / finished * left if finished else None
        if self.time_budget is not None:
            budget_left = max(0.0, self.time_budget - self.elapsed_before - (now - self.t0))
            return budget_left if guess is None else min(guess, budget_left)
        return guess

    def _refresh(self) -> None:
        self.bar.set_postfix_str(self.postfix(), refresh=True)

    def _heartbeat(self, every: float) -> None:
        while not self.stop.wait(every):
            with self.lock:
                self._refresh()

    def close(self) -> None:
        self.stop.set()
        self.beat.join()
        with self.lock:
            self._refresh()
            self.bar.close()
