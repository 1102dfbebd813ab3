"""A search's wall-clock budget (``search.time_budget``) and the account of how it was spent.

>>> parse_duration("90m"), parse_duration("4h"), parse_duration("1h30m"), parse_duration(45)
(5400.0, 14400.0, 5400.0, 45.0)
>>> parse_duration("soon")
Traceback (most recent call last):
...
rankitect.errors.ConfigError: config key 'search.time_budget': 'soon' is not a duration (e.g. 90m, 4h, 1h30m, 3600s or seconds)
>>> clock = iter([0.0, 50.0, 130.0]).__next__
>>> budget = TimeBudget(100.0, clock=clock)      # starts at 0
>>> budget.exhausted(), budget.exhausted()       # at 50 s, at 130 s
(False, True)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from rankitect.errors import ConfigError
from rankitect.search.judging.pruning import pruned_early

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


def parse_duration(value: str | float | None, key: str = "search.time_budget") -> float | None:
    """Seconds in ``value``: a number of seconds, or a string such as ``"90m"``, ``"4h"``,
    ``"1h30m"``, ``"3600s"``; ``None`` stays ``None``. Anything else, or a duration that is not
    positive, is a :class:`~rankitect.errors.ConfigError` naming ``key``."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if parts and _PART.sub("", text).strip() == "":
                seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds is None:
        raise ConfigError(f"config key {key!r}: {value!r} is not a duration (e.g. 90m, 4h, 1h30m, 3600s or seconds)")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(f"config key {key!r}: the duration must be positive, got {value!r}")
    return seconds


class TimeBudget:
    """Wall-clock seconds a search may spend, counted from its start plus ``elapsed`` earlier
    (a resumed search goes on spending the same budget).

    Args:
        seconds: the budget; ``None`` never runs out.
        clock: monotonic seconds (a fake one in tests).
        elapsed: seconds spent before this process took over.
    """

    def __init__(self, seconds: float | None, *, clock: Callable[[], float] = time.monotonic,
                 elapsed: float = 0.0) -> None:
        self.seconds, self.clock, self.before = seconds, clock, elapsed
        self.start = clock()

    def spent(self) -> float:
        return self.before + self.clock() - self.start

    def exhausted(self) -> bool:
        return self.seconds is not None and self.spent() >= self.seconds

    def left(self) -> float | None:
        """Seconds left (at least 0); ``None`` without a budget."""
        return None if self.seconds is None else max(0.0, self.seconds - self.spent())

    def deadline(self) -> float | None:
        """The ``time.time()`` instant at which the budget runs out: what a training in this or
        another process stops at (:func:`~rankitect.train.protocol.deadline_passed`); ``None``
        without a budget."""
        left = self.left()
        return None if left is None else time.time() + left

    def words(self) -> str:
        """``"spent of budget min"``, for the lines that say the budget ran out."""
        return f"{self.spent() / 60:.1f} of {self.seconds / 60:.1f} min"

    def line(self, spent: dict[str, float], cut: list[str]) -> str:
        """How the budget went: minutes by what they went to (``spent``, from :func:`spending`), and
        the trials it cut short (``cut``)."""
        parts = ", ".join(f"{k} {spent[k] / 60:.1f}" for k in spent if k != "total" and spent[k] > 0)
        line = f"time budget {self.seconds / 60:.1f} min: spent {spent['total'] / 60:.1f} min ({parts} min)"
        return line + (f"; stopped at the budget with their best validation: {', '.join(cut)}" if cut else "")


class TrialSlots:
    """``search.trials`` across the processes of a search: the candidates it trains and how many
    may still start.

    A pruned trial gives its slot back, yet proposals stop at ``trials * reduction`` while the
    strategy's trials are pruned (``reduction``: ``search.pruning_reduction``, None without pruning),
    so a search whose every candidate is pruned still ends. A trial the early rung stopped
    (``search.pruning_early_rung``) cost about a ``reduction``-th of one stopped at the first rung and
    counts as that share of a proposal. With ``shared`` (a
    :class:`~rankitect.search.running.shared_study.SharedStudy`) every process's trials count, each
    proposal as a whole one.
    """

    def __init__(self, strategy: Any, trials: int, *, reduction: int | None, shared: Any = None) -> None:
        self.strategy, self.trials, self.reduction, self.shared = strategy, trials, reduction, shared

    def budget(self) -> int:
        """How many candidates the search trains: ``search.trials``, or what the strategy says (a
        supernet's ``top_k``)."""
        return self.strategy.budget(self.trials)

    def left(self, candidates: list[Any], in_flight: int) -> int:
        """Candidates still to start: the budget less finished and running ones (of every process);
        ``candidates`` are this process's finished ones (checkpoint records)."""
        trials = self.budget()
        cap = trials * (self.reduction if self.reduction is not None and self.strategy.prunable else 1)
        if self.shared is None:
            finished = sum(1 for t in candidates if not t.result.pruned)
            share = 1 / (self.reduction or 1)
            proposed = math.ceil(sum(share if pruned_early(t.result) else 1 for t in candidates) - 1e-9)
            return min(trials - finished, cap - proposed) - in_flight
        slots, proposals = self.shared.count()
        return min(trials - slots, cap - proposals)

    def claim(self, name: str) -> bool:
        """Take a slot for the candidate ``name``; False when another process took the last one."""
        return self.shared is None or self.shared.claim(name, self.budget())


SPENDING = ("baselines", "candidates", "pruned", "failed", "retrains")


def spending(trials: Iterable[Any], retrained: set[str], total: float) -> dict[str, float]:
    """Seconds of ``total`` by what they went to: training of baselines, of candidates that finished,
    were pruned or failed, of retrains (``retrained``: names of a supernet plan's architectures),
    and ``other`` (supernets, set-up, tracking). ``trials`` are checkpoint records."""
    out = dict.fromkeys(SPENDING, 0.0)
    for t in trials:
        if getattr(t, "reused_from", None):  # trained in an earlier search: no time of this one
            continue
        seconds = t.result.train_seconds or 0.0
        status = t.result.status
        if t.kind == "baseline":
            out["baselines"] += seconds
        elif t.name in retrained:
            out["retrains"] += seconds
        elif status in ("pruned", "failed"):
            out[status] += seconds
        else:
            out["candidates"] += seconds
    out["other"] = max(0.0, total - sum(out.values()))
    out["total"] = total
    return out
