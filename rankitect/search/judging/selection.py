"""A search's winner and its ``auto`` FLOPs target, chosen with paired standard errors.

A search ranks models by their validation objective. On the validation split of ~10^4 rows two
models' NE differ by noise alone by tenths of a percent, and the best on validation of many
candidates is better there than it truly is (the winner's curse): a candidate that wins on
validation by less than the noise loses to the baseline on test about as often as it wins. So the
best baseline by objective (the *incumbent*: what an engineer would ship without a search) is
replaced by a candidate only when the candidate's objective is better by more than
``search.min_gain_se`` standard errors of the difference, the one-standard-error rule at the
default 1 (Hastie, Tibshirani and Friedman, *Elements of Statistical Learning*, 7.10: keep the
simpler model unless the other is better by more than one standard error). A gain far above the
noise (a 4% better model) passes at once; ``0`` restores the plain rule (the lowest objective wins).
Among the candidates that pass, the same rule prefers the simpler: the winner is the cheapest (in
FLOPs) whose objective is within ``min_gain_se`` standard errors of the best candidate's, so a model
four times the cost of one that is as good within the noise is not what the search returns.

The standard error is paired: both models are scored on the same validation rows, so with
per-example losses ``a_i`` and ``b_i`` (nats) and the validation split's entropy ``H`` the
difference of NE is ``mean(a - b) / H`` and its standard error ``sd(a - b) / (sqrt(n) H)``, much
smaller than the two NEs' own errors, since most of a row's loss is the row's, not the model's.
The objective's FLOPs factors ``k = 1 + w * doublings`` (see :mod:`rankitect.eval.objective`)
weigh each side: the difference of objectives is ``mean(k_b b - k_a a) / H``.

``search.target_mflops: auto`` (the default) is the FLOPs of the best baseline by validation NE:
the model a team would ship, so the search looks for a lower NE at no more than its cost (the
``relaxed`` penalty charges only FLOPs above it; below it nothing rewards being cheaper). The same
noise rule names the cheapest baseline within ``min_gain_se`` standard errors of it. A cheaper aim
is asked for by name: a number, or ``cheapest``: the FLOPs of the cheapest baseline whose objective
is within ``min_gain_se`` standard errors of the best baseline's, the baselines weighed as candidates
are, each paying the objective's penalty for its doublings of FLOPs beyond the cheapest baseline (at
the default weight a baseline ten times the cost of another is the better one only if its NE is
more than 3.3% lower). That rule aims at the cheapest baseline wherever NE gaps are small, and the
search then spends its turns on cheaper models instead of better ones.

>>> rng = np.random.default_rng(0)
>>> b = rng.exponential(0.5, 10_000)                 # the incumbent's per-example losses
>>> a = b - 0.01 + rng.normal(0, 0.05, 10_000)       # a challenger better by 0.01 nats a row
>>> gain, se = paired_gain(b, a, entropy=0.5)        # in NE: 0.02, its standard error 0.001
>>> round(gain, 2), round(se, 4), gain / se > 10
(0.02, 0.001, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult

DEFAULT_MIN_GAIN_SE = 1.0  # the one-standard-error rule


def paired_gain(incumbent: np.ndarray, challenger: np.ndarray, *, entropy: float, k_incumbent: float = 1.0,
                k_challenger: float = 1.0) -> tuple[float, float]:
    """The challenger's gain over the incumbent, ``mean(k_i * inc - k_c * ch) / H``, and its paired
    standard error, ``sd(k_i * inc - k_c * ch) / (sqrt(n) H)``, from per-example losses on the same
    rows (``entropy`` is ``H``; ``k_*`` the objective's FLOPs factors). Positive: the challenger is
    better."""
    inc, ch = np.asarray(incumbent, dtype=np.float64), np.asarray(challenger, dtype=np.float64)
    if inc.shape != ch.shape or inc.ndim != 1 or len(inc) < 2:
        raise ValueError(f"paired losses need two 1-d arrays of the same length >= 2, got {inc.shape} and {ch.shape}")
    if not (entropy > 0 and math.isfinite(entropy)):
        raise ValueError(f"entropy must be a positive number, got {entropy!r}")
    d = (k_incumbent * inc - k_challenger * ch) / entropy
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


@dataclass(frozen=True, eq=False)
class Entrant:
    """One trained model of a search: its name, ``candidate`` or ``baseline``, its result and its
    per-example validation losses (None when not kept: a search checkpointed before they were,
    or another machine's trial without a shared folder; the plain rule then judges it)."""

    name: str
    kind: str
    result: TrialResult
    losses: np.ndarray | None = None

    def entropy(self) -> float | None:
        """``H`` of the validation split, from this model's own mean loss and NE (NE = loss / H)."""
        if self.losses is None or not self.result.ok or not self.result.val_ne or len(self.losses) < 2:
            return None
        h = float(np.mean(self.losses, dtype=np.float64)) / self.result.val_ne
        return h if h > 0 and math.isfinite(h) else None


@dataclass(frozen=True)
class Pick:
    """The winner the rule picked, and why: ``incumbent`` is the best baseline by objective (None without one); ``z``
    the winner's gain over it in standard errors (None for the incumbent itself, ``inf`` where no
    losses allowed a paired error); ``runner_up`` the best candidate held back by the rule, with its ``z``."""

    winner: Entrant
    incumbent: Entrant | None = None
    z: float | None = None
    runner_up: tuple[Entrant, float] | None = None
    best: Entrant | None = None  # the best candidate by objective, where the winner is a cheaper one within its noise
    # The ok candidate with the lowest objective (whether it won or not) and its z over the incumbent
    # (None where its objective is not below the incumbent's, or there is no incumbent).
    top: tuple[Entrant, float | None] | None = None

    def line(self, min_gain_se: float) -> str:
        """One plain sentence for the search's output."""
        w = self.winner
        if self.incumbent is None:
            return f"winner {w.name}: the lowest validation objective (no baseline finished)"
        if w is self.incumbent:
            if self.runner_up is None:
                return f"winner {w.name}: the best baseline; no candidate has a lower validation objective"
            cand, z = self.runner_up
            return (f"winner {w.name}: the best baseline; the best candidate, {cand.name}, is better on validation "
                    f"by {z:.2f} standard errors only (search.min_gain_se = {min_gain_se:g})")
        gain = "" if self.z is None or not math.isfinite(self.z) else f" by {self.z:.2f} standard errors"
        cheaper = ("" if self.best is None else f"; the cheapest candidate within {min_gain_se:g} standard "
                   f"error{'s' * (min_gain_se != 1)} of the best, {self.best.name}")
        return f"winner {w.name}: better on validation than the best baseline, {self.incumbent.name}{gain}{cheaper}"


    def lines(self, min_gain_se: float) -> list[str]:
        """The search's closing lines, which say one thing: the winner the rule chose (what ``export``
        and the logged model hold) and its difference to the best baseline on validation and on test;
        then, when the best candidate by validation objective is not the winner, that candidate
        and why it lost."""
        w, inc = self.winner, self.incumbent
        head = f"winner {w.name} ({w.kind}; what rankitect export and the logged model hold): "
        if inc is None:
            why = "the lowest validation objective (no baseline finished)"
        elif w is inc:
            why = "the best baseline by validation objective"
        else:
            gain = "" if self.z is None or not math.isfinite(self.z) else f" by {self.z:.2f} standard errors"
            why = f"better on validation objective than the best baseline{gain}"
        out = [head + versus(w, None if w is inc else inc) + f"; {why}"]
        if self.top is not None and self.top[0] is not w:
            cand, z = self.top
            out.append(f"best candidate {cand.name} by validation objective: {versus(cand, w)}; not the winner: "
                       + _lost(cand, z, w, inc, min_gain_se))
        return out


def _ne(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _change(value: float | None, ref: float | None) -> str:
    if value is None or ref is None or not (math.isfinite(value) and math.isfinite(ref)) or ref == 0:
        return ""
    return f" ({100 * (value / ref - 1):+.2f}%)"


def versus(e: Entrant, ref: Entrant | None) -> str:
    """``e``'s validation and test NE and FLOPs, each NE with its relative change against ``ref``."""
    r = e.result
    text = (f"val/ne {_ne(r.val_ne)}{_change(r.val_ne, ref and ref.result.val_ne)}, test/ne {_ne(r.test_ne)}"
            f"{_change(r.test_ne, ref and ref.result.test_ne)}, {r.mflops:.4g} MFLOPs")
    if ref is None:
        return text
    return text + f" vs {ref.name}'s {_ne(ref.result.val_ne)} and {_ne(ref.result.test_ne)}"


def _lost(cand: Entrant, z: float | None, winner: Entrant, inc: Entrant | None, min_gain_se: float) -> str:
    """Why the best candidate by objective is not the winner the rule chose."""
    errors = f"{min_gain_se:g} standard error{'s' * (min_gain_se != 1)}"
    if inc is None or z is None:
        return "its validation objective (FLOPs penalty included) is not below the best baseline's"
    if z <= min_gain_se:
        return (f"better than the best baseline {inc.name} on validation by {z:.2f} standard errors only "
                f"(search.min_gain_se = {min_gain_se:g})")
    return (f"{winner.name} is within {errors} of it and cheaper ({winner.result.mflops:.4g} vs "
            f"{cand.result.mflops:.4g} MFLOPs)")


def _gain(objective: Objective, inc: Entrant, ch: Entrant) -> tuple[float, float]:
    """Objective gain of ``ch`` over ``inc`` and its paired standard error (0 where losses are missing)."""
    gain = objective(inc.result) - objective(ch.result)
    h = inc.entropy()
    if h is None or ch.losses is None or len(ch.losses) != len(inc.losses):
        return gain, 0.0
    k = [1.0 + objective.weight * objective.doublings(e.result.mflops) for e in (inc, ch)]
    _, se = paired_gain(inc.losses, ch.losses, entropy=h, k_incumbent=k[0], k_challenger=k[1])
    return gain, se


def _z(gain: float, se: float) -> float:
    if se > 0:
        return gain / se
    return math.inf if gain > 0 else -math.inf if gain < 0 else 0.0


def choose_winner(entrants: Sequence[Entrant], objective: Objective,
                  min_gain_se: float = DEFAULT_MIN_GAIN_SE) -> Pick | None:
    """The search's winner (see the module docstring); None when nothing finished ok.

    The incumbent is the ok baseline with the lowest objective (the first on ties). A candidate
    with a lower objective passes when its gain is more than ``min_gain_se`` paired standard errors;
    of those that do, the winner is the cheapest whose objective is within ``min_gain_se`` paired
    standard errors of the best of them (the lowest objective; itself where no other is). Without a
    baseline the lowest objective wins.
    """
    if not min_gain_se >= 0:
        raise ValueError(f"min_gain_se must be >= 0, got {min_gain_se!r}")
    ok = [e for e in entrants if e.result.ok]
    if not ok:
        return None
    bases = [e for e in ok if e.kind == "baseline"]
    cands = [e for e in ok if e.kind != "baseline"]
    top_cand = min(cands, key=lambda e: objective(e.result), default=None)
    if not bases:
        return Pick(winner=min(ok, key=lambda e: objective(e.result)),
                      top=None if top_cand is None else (top_cand, None))
    inc = min(bases, key=lambda e: objective(e.result))
    challengers = sorted((e for e in cands if objective(e.result) < objective(inc.result)),
                         key=lambda e: objective(e.result))
    scored = [(ch, _z(*_gain(objective, inc, ch))) for ch in challengers]
    top = scored[0] if scored else None if top_cand is None else (top_cand, None)
    passed = [(ch, z) for ch, z in scored if z > min_gain_se]
    if passed:
        best = passed[0][0]
        tied = [(ch, z) for ch, z in passed if ch is best or -_z(*_gain(objective, best, ch)) <= min_gain_se]
        winner, z = min(tied, key=lambda cz: cz[0].result.mflops)  # the first (lowest objective) on ties
        return Pick(winner=winner, incumbent=inc, z=z, best=None if winner is best else best, top=top)
    held = max(scored, key=lambda cz: cz[1], default=None)
    return Pick(winner=inc, incumbent=inc, runner_up=held, top=top)


TARGET_RULES = ("auto", "simplest", "cheapest")  # the values of search.target_mflops that a baseline resolves


@dataclass(frozen=True)
class Target:
    """A FLOPs target read off the baselines (``search.target_mflops: auto`` or ``cheapest``).

    ``target`` is the baseline whose FLOPs are the target, ``best`` the best baseline by the rule's
    measure, and ``cheapest`` the cheapest baseline within ``min_gain_se`` paired standard errors of
    ``best`` (``best`` itself where none is): under ``auto`` the output names it, under ``cheapest``
    it is the target.
    """

    rule: str
    target: Entrant
    best: Entrant
    cheapest: Entrant

    @property
    def mflops(self) -> float:
        return float(self.target.result.mflops)

    def line(self, min_gain_se: float) -> str:
        """One plain sentence for the search's output."""
        errors = f"{min_gain_se:g} standard error{'s' * (min_gain_se != 1)}"
        head = f"target_mflops {self.rule}: {self.mflops:.4f} MFLOPs ({self.target.name}"
        if self.rule == "auto":
            line = head + ", the best baseline by val/ne)"
            if self.cheapest is not self.best:
                c = self.cheapest
                line += (f"; the cheapest baseline within {errors} of it: {c.name} at {c.result.mflops:.4f} MFLOPs "
                         "(search.target_mflops=cheapest aims there)")
            return line
        measure = "val/ne and its FLOPs" if self.rule == "cheapest" else "val/ne"
        if self.target is self.best:
            return head + f", the best baseline by {measure})"
        return (head + f", the cheapest baseline within {errors} of the best by {measure}, "
                f"{self.best.name} at {self.best.result.mflops:.4f} MFLOPs)")


def auto_target(baselines: Sequence[Entrant], min_gain_se: float = DEFAULT_MIN_GAIN_SE,
                objective: Objective | None = None, rule: str = "auto") -> Target | None:
    """The FLOPs target a rule reads off the baselines; None when no baseline finished.

    * ``auto`` (the default): the FLOPs of the ok baseline with the lowest validation NE (the model
      a team would ship; the first on ties). The search then looks for a lower NE at no more than
      its cost; ``cheapest`` is only named.
    * ``simplest``: the FLOPs of the cheapest ok baseline whose validation NE is within
      ``min_gain_se`` paired standard errors of the best's (the one-standard-error rule's simplest
      model): a best baseline ahead of a far cheaper one by noise alone does not set the target.
    * ``cheapest``: ``best`` is the ok baseline with the lowest objective when the target is the
      cheapest baseline's FLOPs (its validation NE with ``objective``'s penalty for every doubling
      of FLOPs beyond the cheapest baseline; NE alone without ``objective``), and the target the
      cheapest ok baseline whose objective is within ``min_gain_se`` paired standard errors of it.

    >>> r = lambda ne, mf: TrialResult(val_ne=ne, mflops=mf)
    >>> bases = [Entrant("dlrm", "baseline", r(0.81, 0.3)), Entrant("dcnv2", "baseline", r(0.80, 0.9))]
    >>> auto_target(bases, objective=Objective(weight=0.01)).target.name  # the best by NE
    'dcnv2'
    >>> auto_target(bases, objective=Objective(weight=0.01), rule="cheapest").target.name  # 1.6 doublings for 1.2%
    'dlrm'
    >>> auto_target(bases, rule="simplest").target.name  # without losses no error is known: the best
    'dcnv2'
    """
    if rule not in TARGET_RULES:
        raise ValueError(f"rule must be one of {TARGET_RULES}, got {rule!r}")
    ok = [e for e in baselines if e.result.ok and math.isfinite(e.result.val_ne) and e.result.mflops > 0]
    if not ok:
        return None
    judge = Objective()  # NE alone
    if rule == "cheapest" and objective is not None:
        judge = objective.with_target(min(e.result.mflops for e in ok))
    best = min(ok, key=lambda e: judge(e.result))
    tied = [e for e in ok if e is best or -_z(*_gain(judge, best, e)) <= min_gain_se]
    cheapest = min(tied, key=lambda e: (e.result.mflops, judge(e.result)))
    return Target(rule, best if rule == "auto" else cheapest, best, cheapest)
