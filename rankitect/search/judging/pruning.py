"""Multi-fidelity search: asynchronous successive halving (ASHA) over validation curves.

Every trained model of a search (baselines first, then candidates of any strategy) is one trial of
a *rung study*: after each validation it reports its best validation NE so far (what it returns if
stopped there) at resource ``k`` (the validation's index, from 1), and successive halving (the
rule of Optuna's :class:`~optuna.pruners.SuccessiveHalvingPruner`, Li et al. 2020, arXiv
1810.05934; :func:`keeps`) stops a candidate at a rung (``min_validations * reduction**r``
validations) unless its NE there is among the best ``1/reduction`` of every trial that reached that
rung. Baselines report too but are never stopped, so from the first candidate on a model must keep
up with the hand-designed ones to be trained further. The rule is the same whichever strategy
proposed the candidate. A rung compares the values every trial reported at that validation (the
study keeps each trial's curve), so the rungs may be placed after the baselines have trained.

``search.pruning_min_validations: auto`` places the first rung from the baselines' curves
(:func:`first_rung`): at the earliest validation from which successive halving, run over the
baselines alone, would have kept the best of them at every rung. A rung earlier than that would
have stopped the best hand-designed model itself; on data where models improve for many epochs and
the best one starts slowly (an attention stack after one epoch can rank last), it stops the
candidates that resemble it before they show what they are. Where the baselines' early ranks hold,
the first rung stays at one validation. It is the default: the best baseline is where the search
starts (the climbs of ``dnas`` and ``oneshot``, the mutations of ``evolution``), and its changes
learn as it does, so a first rung that would have stopped it stops what the search builds on. The
price is fewer candidates in a fixed wall clock where the baselines' early ranks do not hold. With
fewer than two finished baselines there is nothing to rank, and the first rung stays at one
validation.

``search.pruning_early_rung`` (asha) makes the first rung cheaper: it moves one step down ASHA's
geometric ladder, to validation ``min_validations // reduction``, or where that is ``0`` to the
*probe*: one validation at ``1/reduction`` of the first validation interval
(:class:`~rankitect.train.protocol.Protocol`), reported as validation ``0``. The later rungs stay
(``min_validations * reduction**k``, ``k >= 1``), so as many candidates are kept as before, and a
candidate stopped at the first rung, as nearly every pruned one is, costs about a
``reduction``-th of what it did. (Added as a rung of its own instead, it would stop two in three
of those that a first rung keeps, and a search that counts trained candidates would propose, and
pay, for more of them.) ``auto`` (the default) moves it only where successive halving over the
baselines keeps the best of them there too (:func:`early_rung`, the test the first rung passes);
the baselines always probe, so that this can be read. The probe is only read: it changes no
training that goes on.

``search.pruning: hyperband`` hedges against a first rung that is too early to rank by (Li et al.
2018, JMLR 18(185), as Optuna's :class:`~optuna.pruners.HyperbandPruner`): each trial falls into
one of several brackets, bracket ``s`` runs the same successive halving with its first rung at
``min_validations * reduction**s`` validations and ranks only against the trials of its bracket. On
data where models improve for many epochs and an architecture that starts slowly ends best, the
later brackets still train such candidates far enough to be judged. The largest resource is the
longest curve of the trials finished when a candidate is first judged (the baselines train first).

Where the rung study lives: in the search's own shared storage (``search.storage``, study
``<study_name>.rungs``), so every process of a shared search prunes against all; otherwise in an
Optuna journal file in the search folder, which the worker processes of ``--workers`` open too.

A trial reports from wherever it trains (this process or a worker): :class:`RungTicket` is the
small, picklable handle it needs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rankitect.search._optuna as _optuna
from rankitect.eval.result import TrialResult

RUNG_SUFFIX = ".rungs"


@dataclass(frozen=True)
class RungTicket:
    """Where one trial reports its validations: storage, study, trial, and the pruner's rule.

    Args:
        storage: an RDB URL, or ``journal:<path>`` for a journal file.
        study_name: the rung study.
        trial_id: the Optuna trial id of this training.
        reduction, min_validations: the successive-halving rule.
        prune: ``False`` for baselines (they report, and are never stopped).
        rule: ``"asha"`` (one bracket) or ``"hyperband"`` (brackets of later first rungs).
        probe: validate once at ``1/reduction`` of the first validation interval too, reported as
            validation ``0`` (a reading; a rung where ``early`` is 0).
        early: the early rung's validation (0: the probe), where a trial that may be pruned is
            judged in place of the first rung (``min_validations``); ``-1``: none.
    """

    storage: str
    study_name: str
    trial_id: int
    reduction: int
    min_validations: int
    prune: bool = True
    rule: str = "asha"
    probe: bool = False
    early: int = -1

    def reporter(self) -> Reporter:
        return Reporter(self)


RULES = ("asha", "hyperband")
EARLY_PRUNED = "pruned at the early rung"  # how the message of a trial the early rung stopped starts
BASELINE_ATTR = "baseline"  # user attribute of a never-stopped trial's rung-study trial


def pruned_early(result: TrialResult) -> bool:
    """Whether the early rung stopped this trial (it cost about a ``reduction``-th of one stopped at
    the first rung).

    >>> pruned_early(TrialResult.pruning(EARLY_PRUNED + ": ...", val_ne=0.9, mflops=1.0, params=1,
    ...                                  train_seconds=1.0, steps=5))
    True
    """
    return result.pruned and (result.error or "").startswith(EARLY_PRUNED)


def keeps(value: float, at_rung: list[float], reduction: int) -> bool:
    """Successive halving at one rung: ``value`` is among the best ``len // reduction`` of the values
    ``at_rung`` (itself included), or the best where fewer than ``reduction`` reached the rung.

    >>> keeps(0.5, [0.4, 0.5, 0.6], 3), keeps(0.5, [0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 3)
    (False, True)
    """
    ranked = sorted(at_rung)
    return value <= ranked[max(len(ranked) // reduction, 1) - 1]


def is_rung(index: int, min_validations: int, reduction: int) -> bool:
    """Whether validation ``index`` is a rung: ``min_validations * reduction**k`` for some ``k >= 0``.

    >>> [k for k in range(1, 30) if is_rung(k, 2, 3)]
    [2, 6, 18]
    """
    if index < min_validations or index % min_validations:
        return False
    k = index // min_validations
    while k % reduction == 0:
        k //= reduction
    return k == 1


def first_rung(curves: dict[str, dict[int, float]], best: str, reduction: int) -> int:
    """The smallest first rung ``m`` at which successive halving over ``curves`` alone keeps ``best``
    at every rung ``m * reduction**k`` of its curve.

    ``curves`` maps each trial to its reported values (the best validation NE so far) by validation
    index. Every trial that reached a rung competes there. ``best`` (the trial of the lowest final
    value) is always kept at its last validation, so the answer is at most its curve's length.

    >>> fast, slow = {1: 0.60, 2: 0.58, 3: 0.58}, {1: 0.70, 2: 0.62, 3: 0.57, 4: 0.55}
    >>> first_rung({"fast": fast, "slow": slow, "other": {1: 0.65, 2: 0.64}}, "slow", 3)
    3
    >>> first_rung({"a": {1: 0.60, 2: 0.55}, "b": {1: 0.70, 2: 0.65, 3: 0.64}}, "a", 3)
    1
    """
    mine = curves[best]
    for m in range(1, max(mine) + 1):
        rungs = [k for k in mine if is_rung(k, m, reduction)]
        if all(keeps(mine[k], [c[k] for c in curves.values() if k in c], reduction) for k in rungs):
            return m
    return max(mine)


def early_rung(curves: dict[str, dict[int, float]], best: str | None, min_validations: int, reduction: int,
               names: dict[str, str] | None = None) -> tuple[int | None, str]:
    """``search.pruning_early_rung: auto``: the validation of the early rung (``min_validations //
    reduction``; 0: the probe) where successive halving over ``curves`` keeps ``best`` there, else
    ``None``; and why, for the log. ``best`` ``None`` (fewer than two baselines): none.

    >>> probe = {"a": {0: 0.70, 1: 0.60}, "b": {0: 0.72, 1: 0.65}, "c": {0: 0.71, 1: 0.64}}
    >>> early_rung(probe, "a", 1, 3)[0], early_rung({**probe, "a": {0: 0.75, 1: 0.60}}, "a", 1, 3)[0]
    (0, None)
    >>> slow = {"a": {k: 0.9 - 0.05 * k for k in range(1, 9)}, "b": {k: 0.7 - 0.01 * k for k in range(1, 9)}}
    >>> early_rung(slow, "a", 7, 3)  # validation 2 of a first rung at 7: a is behind b there
    (None, 'no early rung at validation 2: successive halving over the baselines there would stop the best, a')
    """
    names = names or {}
    if best is None:
        return None, "no early rung: fewer than 2 baselines finished"
    at = min_validations // reduction
    short = "the probe" if at == 0 else f"validation {at}"
    where = short + (f", 1/{reduction} of the first validation interval" if at == 0 else
                     f", 1/{reduction} of the first rung's")
    if at == 0 and any(0 not in c for c in curves.values()):
        return None, "no early rung: a baseline has no probe validation (reused from a search without one)"
    who = names.get(best, best)
    if at not in curves[best] or not keeps(curves[best][at], [c[at] for c in curves.values() if at in c], reduction):
        return None, f"no early rung at {short}: successive halving over the baselines there would stop the best, {who}"
    return at, f"an early rung at {where} (successive halving over the baselines keeps the best, {who}, there)"


def _name(trial: Any) -> str:
    return str(trial.user_attrs.get("name", trial.number))


def _pruner(rule: str, reduction: int, min_validations: int) -> Any:
    optuna = _optuna.import_optuna()
    if rule == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=min_validations, max_resource="auto",
                                              reduction_factor=reduction)
    return optuna.pruners.NopPruner()  # successive halving is judged here, by validation index (Reporter)


def _storage(location: str) -> Any:
    if location.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental in some Optuna versions
            return JournalStorage(JournalFileBackend(location[len("journal:"):]))
    from rankitect.search.running.shared_study import rdb_storage

    return rdb_storage(location)


class Reporter:
    """The callable a training calls after each validation (see :mod:`rankitect.train.protocol`)."""

    def __init__(self, ticket: RungTicket) -> None:
        optuna = _optuna.import_optuna()
        self.ticket = ticket
        study = optuna.load_study(study_name=ticket.study_name, storage=_storage(ticket.storage),
                                  pruner=_pruner(ticket.rule, ticket.reduction, ticket.min_validations))
        self.trial = optuna.trial.Trial(study, ticket.trial_id)
        self.probe = ticket.reduction if ticket.probe else 0  # read by the Protocol: the probe at interval // this

    def __call__(self, index: int, ne: float, final: bool = False) -> None:
        """Report validation ``index``; raise ``TrialPruned`` when the rule stops this trial (never at
        a ``final`` validation, where training ends anyway: it still counts at its rung)."""
        from rankitect.train.task import TrialPruned

        self.trial.report(ne, step=index)  # the protocol reports finite NEs only (else it diverged)
        stops = self._stops(index, ne)
        if not (stops and self.ticket.prune and not final):
            return
        if index == self.ticket.early:
            where = "the probe" if index == 0 else f"validation {index}"
            raise TrialPruned(f"{EARLY_PRUNED} ({where}): validation NE {ne:.4f} is not among the best "
                              f"1/{self.ticket.reduction} there")
        raise TrialPruned(f"pruned after validation {index}: validation NE {ne:.4f} is not among the best "
                              f"1/{self.ticket.reduction} at that point")

    def _judged(self, index: int) -> bool:
        """Whether validation ``index`` is a rung of this trial: the early rung, or a rung of the
        ladder but the first where the early rung took its place (the probe, 0, is no other rung)."""
        t = self.ticket
        if index == t.early:
            return True
        if index == 0 or (t.early >= 0 and index == t.min_validations):
            return False
        return is_rung(index, t.min_validations, t.reduction)

    def _stops(self, index: int, ne: float) -> bool:
        t = self.ticket
        if t.rule == "hyperband":
            return self.trial.should_prune()
        if not self._judged(index):
            return False
        others = [tr.intermediate_values[index] for tr in self.trial.study.get_trials(deepcopy=False)
                  if tr._trial_id != t.trial_id and index in tr.intermediate_values]
        return not keeps(ne, [*others, ne], t.reduction)


class Rungs:
    """The rung study of one search (opened by the process that submits trials).

    Args:
        storage: the search's shared storage URL, or ``None`` for a journal file at ``journal``.
        study_name: the shared study's name (the rung study is ``study_name + ".rungs"``).
        journal: the journal file used without shared storage.
        reduction, min_validations, rule: see :class:`RungTicket`; ``min_validations="auto"`` (asha
            only; hyperband takes 1) is 1 until :meth:`calibrate` places it from the baselines.
        early: ``True``, ``False`` or ``"auto"`` (asha only): whether candidates are judged at the
            early rung in place of the first; ``auto`` decides in :meth:`calibrate`. Baselines
            probe unless ``False``.
    """

    def __init__(self, storage: str | None, study_name: str | None, journal: Path, *, reduction: int,
                 min_validations: int | str, rule: str = "asha", early: bool | str = False) -> None:
        self.auto = min_validations == "auto"
        if self.auto:
            min_validations = 1
        if reduction < 2 or not isinstance(min_validations, int) or min_validations < 1:
            raise ValueError(f"successive halving needs reduction >= 2 and min_validations >= 1 (or 'auto'), "
                             f"got {reduction} and {min_validations!r}")
        if rule not in RULES:
            raise ValueError(f"pruning rule must be one of {RULES}, got {rule!r}")
        self.auto = self.auto and rule == "asha"
        if early not in (True, False, "auto"):
            raise ValueError(f"early must be true, false or 'auto', got {early!r}")
        self.reduction, self.min_validations, self.rule = reduction, min_validations, rule
        self.early_rule: bool | str = early if rule == "asha" else False
        # the early rung candidates are judged at now (0: the probe), None: none; calibrate decides with auto
        self.early: int | None = min_validations // reduction if self.early_rule is True else None
        self.early_note: str | None = None  # what calibrate decided about it, for the log
        if storage is None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            self.location, self.study_name = f"journal:{journal}", "rungs"
            self.study = _optuna.open_study(_storage(self.location), self.study_name, ["minimize"])
        else:
            self.location, self.study_name = storage, f"{study_name}{RUNG_SUFFIX}"
            from rankitect.search.running.shared_study import SharedStudy

            self.study = SharedStudy(storage, self.study_name).open(["minimize"])
        self._numbers: dict[int, int] = {}  # trial id -> number

    def ticket(self, name: str, *, prune: bool = True) -> RungTicket:
        """A new RUNNING trial for the training of ``name``."""
        trial = self.study.ask()
        trial.set_user_attr("name", name)
        if not prune:
            trial.set_user_attr(BASELINE_ATTR, True)
        self._numbers[trial._trial_id] = trial.number
        early = self.early if prune and self.early is not None else -1
        probe = early == 0 if prune else self.early_rule is not False
        return RungTicket(self.location, self.study_name, trial._trial_id, self.reduction, self.min_validations, prune,
                          self.rule, probe, early)

    def replay(self, name: str, curve: Sequence[float], result: TrialResult, probe_ne: float | None = None) -> None:
        """Enter a never-stopped training of ``name`` that ran elsewhere (a reused baseline,
        :mod:`rankitect.search.running.reuse`) as if it had reported here: its probe (``probe_ne``,
        where it had one), after each validation of ``curve`` (validation NE in order) its best so
        far, as :class:`Reporter` reports, then ``result``; the first rung is then placed from it as
        from a baseline trained here."""
        trial = self.study.ask()
        trial.set_user_attr("name", name)
        trial.set_user_attr(BASELINE_ATTR, True)
        if probe_ne is not None and math.isfinite(probe_ne):
            trial.report(probe_ne, step=0)
        best = math.inf
        for index, ne in enumerate(curve, start=1):
            best = min(best, ne)
            if math.isfinite(best):
                trial.report(best, step=index)
        self._numbers[trial._trial_id] = trial.number
        self.close(RungTicket(self.location, self.study_name, trial._trial_id, self.reduction, self.min_validations,
                              False, self.rule), result)

    def calibrate(self) -> tuple[int, str | None] | None:
        """With ``min_validations="auto"``: place the first rung by :func:`first_rung` over the curves of
        the finished never-stopped trials (the baselines), for the best of them (lowest validation NE).
        Returns ``(first rung, that baseline's name)``; ``(1, None)`` where fewer than two baselines
        finished (one curve ranks against nothing: the first rung stays at one validation); ``None``
        with a fixed first rung. With ``early="auto"`` it also decides whether candidates are judged
        at the early rung (:func:`early_rung`; :attr:`early_note` says what and why)."""
        done = [t for t in self.study.get_trials(deepcopy=False, states=(_optuna.import_optuna().trial.TrialState.COMPLETE,))
                if t.user_attrs.get(BASELINE_ATTR) and t.intermediate_values and t.value is not None]
        best = min(done, key=lambda t: t.value) if len(done) >= 2 else None
        curves = {str(t.number): dict(t.intermediate_values) for t in done}
        placed: tuple[int, str | None] | None = None
        if self.auto:
            self.min_validations = 1 if best is None else first_rung(curves, str(best.number), self.reduction)
            placed = self.min_validations, None if best is None else _name(best)
        if self.early_rule == "auto":
            self.early, self.early_note = early_rung(curves, None if best is None else str(best.number),
                                                     self.min_validations, self.reduction,
                                                     {str(t.number): _name(t) for t in done})
        elif self.early_rule is True:
            self.early = self.min_validations // self.reduction
        return placed

    def close(self, ticket: RungTicket, result: TrialResult) -> None:
        """Finish the ticket's trial as COMPLETE (its best validation NE), PRUNED or FAIL."""
        optuna = _optuna.import_optuna()
        states = optuna.trial.TrialState
        number = self._numbers.pop(ticket.trial_id)
        if result.ok:
            self.study.tell(number, float(result.val_ne))
        else:
            self.study.tell(number, state=states.PRUNED if result.pruned else states.FAIL)
