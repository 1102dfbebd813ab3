"""The search's verdict: its final choice, made on validation rows nothing else in the search has seen.

A search ranks, prunes, early-stops and climbs on its validation split, among dozens of proposals,
so the best candidate there is better there than it truly is (the winner's curse), while the best
baseline, trained once and not selected that way, is not. A gain read off those rows overstates
what the winner gains on new data: a candidate better by 1.45 standard errors there can be worse
on test. So a share of the validation requests (``search.verdict.fraction``) is held out
(:meth:`~rankitect.data.clickdata.ClickData.with_verdict`): no training, early stopping, pruning,
surrogate, supernet or climb reads them, and every trained model is scored on them once, when its
training ends (per-example losses, kept beside the validation ones).

The final choice is the winner rule (:func:`~rankitect.search.judging.selection.choose_winner`)
applied once more, on those rows, to the best baseline by validation objective (the *incumbent*)
and the search's *finalists*: its ``search.verdict.finalists`` best candidates by validation
objective among those better than the incumbent on validation. A finalist replaces the incumbent
only when its objective on the held-out rows is better by more than ``search.verdict.min_gain_se``
paired standard errors; among those that are, the cheapest within that noise of the best wins. A
few finalists judged once on fresh rows carry little selection of their own, so the gain the
verdict states is near what the winner gains on new data, and it is the gain the search prints.

Without held-out rows (``fraction`` 0, a checkpoint from before, a validation split too small to
carve) the choice is the winner rule on validation, as before, and the lines say so.

>>> from rankitect.eval.objective import Objective
>>> from rankitect.eval.result import TrialResult
>>> rng = np.random.default_rng(0)
>>> base = rng.exponential(0.5, 4_000)
>>> e = lambda name, kind, ne: Entrant(name, kind, TrialResult(val_ne=ne, test_ne=ne, mflops=1.0))
>>> held = {"dlrm": base, "aaaa": base - 0.02, "bbbb": base + 0.01}   # bbbb best on validation only
>>> v = judge([e("dlrm", "baseline", 0.80), e("aaaa", "candidate", 0.79), e("bbbb", "candidate", 0.78)],
...           held, Objective(), entropy=0.5)
>>> v.winner.name, [j.entrant.name for j in v.finalists], round(v.judged(v.winner).gain, 3)
('aaaa', ['bbbb', 'aaaa'], 0.04)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rankitect.eval.objective import Objective
from rankitect.search.judging.selection import (
    DEFAULT_MIN_GAIN_SE, Entrant, Pick, choose_winner, paired_gain, versus,
)

DEFAULT_FINALISTS = 3


@dataclass(frozen=True)
class Judged:
    """A finalist on the held-out rows: its NE there, and its objective gain over the incumbent there
    with the paired standard error (NE units; positive: better)."""

    entrant: Entrant
    ne: float
    gain: float
    se: float

    @property
    def z(self) -> float:
        return self.gain / self.se if self.se > 0 else math.copysign(math.inf, self.gain) if self.gain else 0.0


@dataclass(frozen=True)
class Verdict:
    """What the search returns, and why.

    ``pick`` is the winner rule on validation alone; ``winner`` the final choice. Where the choice was
    made on held-out rows (``rows`` > 0): ``incumbent`` is the best baseline by validation objective
    and ``incumbent_ne`` its NE there, ``finalists`` the candidates judged there (best by validation
    first).
    """

    pick: Pick
    winner: Entrant
    rows: int = 0
    incumbent: Entrant | None = None
    incumbent_ne: float | None = None
    finalists: tuple[Judged, ...] = ()
    min_gain_se: float = DEFAULT_MIN_GAIN_SE
    clicks: int | None = None  # the clicks among the held-out rows, where known

    @property
    def held_out(self) -> bool:
        """Whether the choice was made on held-out rows."""
        return self.rows > 0 and self.incumbent is not None

    def judged(self, entrant: Entrant) -> Judged | None:
        """``entrant`` as a finalist on the held-out rows (None where it was not one)."""
        return next((j for j in self.finalists if j.entrant is entrant), None)

    def lines(self, min_gain_se: float) -> list[str]:
        """The search's closing lines: the winner (what ``export`` and the logged model hold) against
        the best baseline, and on which rows it was chosen; then the best candidate by validation
        objective where it is not the winner, and why (``min_gain_se``: the validation rule's)."""
        if not self.held_out:
            return [*self.pick.lines(min_gain_se),
                    "chosen on the validation rows the search ranked on: no rows held out for the verdict "
                    "(search.verdict.fraction 0, or a validation split too small to carve)"]
        w, inc = self.winner, self.incumbent
        head = f"winner {w.name} ({w.kind}; what rankitect export and the logged model hold): "
        return [head + versus(w, None if w is inc else inc) + "; " + self._why(), *self._best_line()]

    def _errors(self) -> str:
        return f"{self.min_gain_se:g} standard error{'s' * (self.min_gain_se != 1)}"

    def _why(self) -> str:
        clicks = "" if self.clicks is None else f"{self.clicks:,} click{'s' * (self.clicks != 1)}; "
        rows = f"{self.rows:,} held-out validation rows ({clicks}no model was trained, stopped, pruned or ranked on them)"
        n = len(self.finalists)
        judged = self.judged(self.winner)
        if judged is not None:
            return (f"chosen on {rows}: NE {judged.ne:.4f} against {self.incumbent.name}'s {self.incumbent_ne:.4f}, "
                    f"objective {self._pct(judged)} ({judged.z:.2f} standard errors; {n} finalist{'s' * (n != 1)} "
                    "judged)")
        if not self.finalists:
            return "the best baseline; no candidate has a lower validation objective"
        best = max(self.finalists, key=lambda j: j.z)
        return (f"the best baseline, kept on {rows}: of {n} finalist{'s' * (n != 1)} better on validation, none is "
                f"better there by more than {self._errors()} (best: {best.entrant.name}, objective {self._pct(best)}, "
                f"{best.z:.2f} standard errors)")

    def _pct(self, judged: Judged) -> str:
        """The finalist's objective change against the incumbent's on the held-out rows, in %, with its error."""
        ref = self.incumbent_ne or math.nan
        return f"{-100 * judged.gain / ref:+.2f}% +- {100 * judged.se / ref:.2f}%"

    def _best_line(self) -> list[str]:
        """The best candidate by validation objective where it is not the winner, and why it lost."""
        top = self.pick.top
        if top is None or top[0].name == self.winner.name:
            return []
        cand = top[0]
        judged = next((j for j in self.finalists if j.entrant.name == cand.name), None)
        if judged is None:
            why = "its validation objective (FLOPs penalty included) is not below the best baseline's"
        elif judged.z <= self.min_gain_se:
            why = (f"on the held-out rows its objective is better than {self.incumbent.name}'s by {judged.z:.2f} "
                   f"standard errors only (search.verdict.min_gain_se = {self.min_gain_se:g})")
        else:
            why = (f"{self.winner.name} is within {self._errors()} of it on the held-out rows and cheaper "
                   f"({self.winner.result.mflops:.4g} vs {cand.result.mflops:.4g} MFLOPs)")
        return [f"best candidate {cand.name} by validation objective: {versus(cand, self.winner)}; not the winner: "
                + why]

    def to_dict(self) -> dict[str, Any]:
        """What ``verdict.json`` in the search folder holds (what the quality bench reads)."""
        return {"winner": self.winner.name, "kind": self.winner.kind, "rows": self.rows, "clicks": self.clicks,
                "min_gain_se": self.min_gain_se, "validation_winner": self.pick.winner.name,
                "incumbent": None if self.incumbent is None else self.incumbent.name,
                "incumbent_ne": self.incumbent_ne,
                "finalists": [{"name": j.entrant.name, "ne": j.ne, "gain": j.gain, "se": j.se}
                              for j in self.finalists]}


def judge(entrants: Sequence[Entrant], held: Mapping[str, np.ndarray], objective: Objective, *,
          entropy: float | None, finalists: int = DEFAULT_FINALISTS, min_gain_se: float = DEFAULT_MIN_GAIN_SE,
          val_min_gain_se: float = DEFAULT_MIN_GAIN_SE, clicks: int | None = None) -> Verdict | None:
    """The search's :class:`Verdict` (see the module docstring); None when nothing finished ok.

    ``held`` maps a trial's name to its per-example losses on the held-out rows (the incumbent's and
    the finalists'; a candidate without them is not a finalist) and ``entropy`` is those rows'
    label entropy (nats; ``None``: no rows held out, the validation rule decides); ``clicks`` their
    clicks, said beside the rows (the verdict's error rests on them).
    """
    pick = choose_winner(entrants, objective, val_min_gain_se)
    if pick is None:
        return None
    inc = pick.incumbent
    if inc is None or entropy is None or not entropy > 0 or held.get(inc.name) is None:
        return Verdict(pick, pick.winner)
    bar = objective(inc.result)
    cands = sorted((e for e in entrants if e.kind != "baseline" and e.result.ok and objective(e.result) < bar
                    and held.get(e.name) is not None and len(held[e.name]) == len(held[inc.name])),
                   key=lambda e: objective(e.result))[:finalists]
    on_held = {e.name: _on_held(e, held[e.name], entropy) for e in [inc, *cands]}
    chosen = choose_winner(list(on_held.values()), objective, min_gain_se)
    winner = next(e for e in [inc, *cands] if e.name == chosen.winner.name)
    k = lambda e: 1.0 + objective.weight * objective.doublings(e.result.mflops)  # noqa: E731
    judged = []
    for c in cands:
        gain, se = paired_gain(held[inc.name], held[c.name], entropy=entropy, k_incumbent=k(inc), k_challenger=k(c))
        judged.append(Judged(c, on_held[c.name].result.val_ne, gain, se))
    return Verdict(pick, winner, rows=len(held[inc.name]), incumbent=inc, incumbent_ne=on_held[inc.name].result.val_ne,
                   finalists=tuple(judged), min_gain_se=min_gain_se, clicks=clicks)


def _on_held(e: Entrant, losses: np.ndarray, entropy: float) -> Entrant:
    """``e`` as the winner rule sees it on the held-out rows: its NE there in place of its validation NE."""
    ne = float(np.mean(losses, dtype=np.float64)) / entropy
    return Entrant(e.name, e.kind, replace(e.result, val_ne=ne), losses)
