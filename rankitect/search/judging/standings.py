"""Where a search's finished trials stand: its winner, the winner under a cost cap, the Pareto table,
and the trials whose weights are kept.

:mod:`rankitect.search.judging.selection` holds the rule (a :class:`~rankitect.search.judging.selection.Pick` from
entrants) and :mod:`rankitect.search.judging.verdict` the final choice on held-out rows;
:class:`Standings` feeds them a search's trials. Per-example validation losses
(:class:`ExampleLosses`) are read only for the trials that can win: the baselines and the candidates
with a lower objective than every baseline. After each recorded trial :meth:`Standings.update` keeps
a running best, picked again only when the new trial can change it (a baseline, or a candidate
below every baseline), so what to keep is known without judging every trial again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from rankitect.eval.objective import Objective, at_most
from rankitect.search.judging.selection import Entrant, Pick, choose_winner
from rankitect.search.judging.verdict import Verdict, judge

if TYPE_CHECKING:
    from rankitect.config import VerdictConfig
    from rankitect.search.running.checkpoint import TrialRecord
    from rankitect.space.architecture import Architecture


class Standings:
    """The finished trials of one search, ranked by ``objective`` under the winner rule with
    ``min_gain_se`` (see :mod:`rankitect.search.judging.selection`)."""

    def __init__(self, objective: Objective, min_gain_se: float, val_losses: ExampleLosses, *,
                 verdict: VerdictConfig | None = None, held_entropy: float | None = None,
                 held_clicks: int | None = None) -> None:
        self.min_gain_se, self.val_losses = min_gain_se, val_losses
        # the final choice on held-out rows (rankitect.search.judging.verdict): ``verdict`` holds its
        # ``finalists`` and ``min_gain_se`` (search.verdict), ``held_entropy`` those rows' label entropy
        # and ``held_clicks`` their clicks (what the verdict's error rests on: a rare-click log has few)
        self.verdict, self.held_entropy, self.held_clicks = verdict, held_entropy, held_clicks
        self.held = {split: ExampleLosses(val_losses.folder.parent, split) for split in ("verdict", "test")}
        self._objective = objective
        self._seen: dict[str, TrialRecord] = {}  # name -> every trial folded into the running best
        self._best: Pick | None = None

    @property
    def objective(self) -> Objective:
        return self._objective

    @objective.setter
    def objective(self, objective: Objective) -> None:
        """Rank by ``objective`` from now on (a resolved target): the running best is picked again."""
        self._objective = objective
        self._best = self.pick(list(self._seen.values()))

    def entrant(self, record: TrialRecord, *, losses: bool = True) -> Entrant:
        """``record`` as the rule sees it; its losses are read (once: see :class:`ExampleLosses`) when
        ``losses`` and the trial finished ok."""
        r = record.result
        return Entrant(record.name, record.kind, r, self.val_losses.load(record.name) if losses and r.ok else None)

    def pick(self, trials: list[TrialRecord]) -> Pick | None:
        """The winner of ``trials`` on validation (:func:`~rankitect.search.judging.selection.choose_winner`)."""
        return choose_winner(self._entrants(trials), self.objective, self.min_gain_se)

    def _entrants(self, trials: list[TrialRecord]) -> list[Entrant]:
        """``trials`` as the rule sees them. Losses are read for the baselines and the candidates with
        a lower objective than every baseline only: no other trial can win (and without a baseline
        the plain rule needs none)."""
        bar = self._bar(trials)
        return [self.entrant(t, losses=t.kind == "baseline" or self.objective(t.result) < bar < math.inf)
                for t in trials]

    def _bar(self, trials: Iterable[TrialRecord]) -> float:
        """The lowest objective of a baseline among ``trials`` (what a candidate must beat to win)."""
        return min((self.objective(t.result) for t in trials if t.kind == "baseline"), default=math.inf)

    def update(self, trials: Iterable[TrialRecord]) -> Pick | None:
        """Fold the trials not seen before into the running best and return it. Only a trial that
        can win picks again: an ok baseline (it may become the incumbent, and moves the bar) or an ok
        candidate below the bar; any other trial leaves the winner as it stands."""
        new = [t for t in trials if t.name not in self._seen]
        bar = self._bar(self._seen.values())
        again = any(t.result.ok and (t.kind == "baseline" or self.objective(t.result) < bar) for t in new)
        self._seen.update((t.name, t) for t in new)
        if again:
            bar = self._bar(self._seen.values())
            self._best = self.pick([t for t in self._seen.values()
                                    if t.kind == "baseline" or (t.result.ok and self.objective(t.result) < bar)])
        return self._best

    def kept(self, mine: list[TrialRecord], keep_top_k: int) -> set[str]:
        """Names among ``mine`` whose weights are kept: every baseline, the ``keep_top_k`` best ok
        candidates by objective and the running best (a candidate that clears the noise may rank below
        candidates that do not). Call :meth:`update` first."""
        ok = sorted((t for t in mine if t.kind == "candidate" and t.result.ok), key=lambda t: self.objective(t.result))
        finalists = self.verdict.finalists if self.verdict is not None else 0  # the verdict may choose any of them
        kept = {t.name for t in mine if t.kind == "baseline"} | {t.name for t in ok[:max(keep_top_k, finalists)]}
        best = self._best
        if best is not None and best.winner.kind == "candidate" and any(t.name == best.winner.name for t in ok):
            kept.add(best.winner.name)
        return kept

    def winner_within(self, trials: list[TrialRecord], max_mflops: float) -> Pick | None:
        """The winner by the same rule among ``trials`` of at most ``max_mflops`` MFLOPs: what the
        search would return under a hard cost cap, read off its Pareto table (a baseline over the cap
        neither competes nor sets the bar)."""
        return self.pick([t for t in trials if at_most(t.result.mflops, max_mflops)])

    def within_target(self, trials: list[TrialRecord], pick: Pick | Verdict) -> str | None:
        """Where ``pick``'s winner costs more than the objective's ``target_mflops``: a line naming the
        winner of ``trials`` under a hard cap at the target (:meth:`winner_within`), the Pareto
        table's other answer."""
        target, won = self.objective.target_mflops, pick.winner.result
        if target is None or won.mflops is None or at_most(won.mflops, target):
            return None
        within = self.winner_within(trials, target)
        if within is None:
            return None
        w = within.winner
        return (f"at no more than target_mflops ({target:.4f} MFLOPs): {w.kind} {w.name}, "
                f"val/ne {w.result.val_ne:.4f} at {w.result.mflops:.4f} MFLOPs")

    def judge(self, trials: list[TrialRecord]) -> Verdict | None:
        """The search's final choice among ``trials`` (:func:`~rankitect.search.judging.verdict.judge`):
        the winner rule on the held-out rows for the best baseline and the finalists, where the
        search holds rows out; the rule on validation otherwise."""
        entrants = self._entrants(trials)
        if self.verdict is None:
            pick = choose_winner(entrants, self.objective, self.min_gain_se)
            return None if pick is None else Verdict(pick, pick.winner)
        held = {t.name: self.held["verdict"].load(t.name) for t in trials if t.result.ok}
        return judge(entrants, {k: v for k, v in held.items() if v is not None}, self.objective,
                     entropy=self.held_entropy, finalists=self.verdict.finalists,
                     min_gain_se=self.verdict.min_gain_se, val_min_gain_se=self.min_gain_se, clicks=self.held_clicks)

    def pareto(self, trials: list[TrialRecord]) -> tuple[pd.DataFrame, Architecture | None, Verdict | None]:
        """The Pareto table of ``trials``, the winner's architecture and the verdict (the winner and why)."""
        from rankitect.eval.pareto import pareto_table

        cands = [(t.arch, t.result) for t in trials if t.kind == "candidate"]
        bases = [(t.name, t.result) for t in trials if t.kind == "baseline"]
        verdict = self.judge(trials)
        won = None if verdict is None else (verdict.winner.kind, verdict.winner.name)
        table = pareto_table(cands, bases, objective=self.objective, winner=won)
        best = None if won is None else next(t.arch for t in trials if (t.kind, t.name) == won)
        return table, best, verdict


class ExampleLosses:
    """Per-example losses of a search's trials on one split (``val``: of each trial's best
    validation, what the winner rule pairs; ``verdict``: on the held-out rows the final choice is
    made on; ``test``: what the quality bench reads), one ``.npy`` (float32) per trial in
    ``folder / "<split>_losses"``; read back without pickle. A trial's file is written once, so what
    was saved or read is kept in memory: a file is read at most once."""

    def __init__(self, folder: Path, split: str = "val") -> None:
        self.folder = Path(folder) / f"{split}_losses"
        self._cache: dict[str, np.ndarray] = {}

    def _path(self, name: str) -> Path:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"a trial name must be a plain file name, got {name!r}")
        return self.folder / f"{name}.npy"

    def save(self, name: str, losses: np.ndarray | None) -> None:
        if losses is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(name)
        tmp = path.with_suffix(".tmp.npy")
        losses = np.asarray(losses, dtype=np.float32)
        np.save(tmp, losses, allow_pickle=False)
        tmp.replace(path)
        self._cache[name] = losses

    def load(self, name: str) -> np.ndarray | None:
        """The trial's losses; None when none were kept or the file is unreadable."""
        path = self._path(name)
        if name in self._cache:
            return self._cache[name]
        if not path.is_file():
            return None
        try:
            losses = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            return None
        if losses.ndim != 1:
            return None
        self._cache[name] = losses
        return losses
