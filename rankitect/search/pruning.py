"""Multi-fidelity search: asynchronous successive halving (ASHA) over validation curves.

Every trained model of a search (baselines first, then candidates of any strategy) is one trial of
a *rung study*: after each validation it reports its best validation NE so far (what it returns if
stopped there) at resource ``k`` (the validation's index, from 1), and Optuna's
:class:`~optuna.pruners.SuccessiveHalvingPruner` (Li et al. 2020, arXiv 1810.05934) stops a candidate at a rung (``min_validations * reduction**r``
validations) unless its NE there is among the best ``1/reduction`` of every trial that reached that
rung. Baselines report too but are never stopped, so from the first candidate on a model must keep
up with the hand-designed ones to be trained further. The rule is the same whichever strategy
proposed the candidate.

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

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankitect.search import _optuna
from rankitect.search.base import TrialResult

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
    """

    storage: str
    study_name: str
    trial_id: int
    reduction: int
    min_validations: int
    prune: bool = True
    rule: str = "asha"

    def reporter(self) -> Reporter:
        return Reporter(self)


RULES = ("asha", "hyperband")


def _pruner(rule: str, reduction: int, min_validations: int) -> Any:
    optuna = _optuna.import_optuna()
    if rule == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=min_validations, max_resource="auto",
                                              reduction_factor=reduction)
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_validations, reduction_factor=reduction,
                                                  min_early_stopping_rate=0)


def _storage(location: str) -> Any:
    if location.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental in some Optuna versions
            return JournalStorage(JournalFileBackend(location[len("journal:"):]))
    from rankitect.search.shared import rdb_storage

    return rdb_storage(location)


class Reporter:
    """The callable a training calls after each validation (see :mod:`rankitect.train.protocol`)."""

    def __init__(self, ticket: RungTicket) -> None:
        optuna = _optuna.import_optuna()
        self.ticket = ticket
        study = optuna.load_study(study_name=ticket.study_name, storage=_storage(ticket.storage),
                                  pruner=_pruner(ticket.rule, ticket.reduction, ticket.min_validations))
        self.trial = optuna.trial.Trial(study, ticket.trial_id)

    def __call__(self, index: int, ne: float, final: bool = False) -> None:
        """Report validation ``index``; raise ``TrialPruned`` when the rule stops this trial (never at
        a ``final`` validation, where training ends anyway: it still counts at its rung)."""
        from rankitect.train.task import TrialPruned

        self.trial.report(ne, step=index)  # the protocol reports finite NEs only (else it diverged)
        if self.trial.should_prune() and self.ticket.prune and not final:
            raise TrialPruned(f"pruned after validation {index}: validation NE {ne:.4f} is not among the best "
                              f"1/{self.ticket.reduction} at that point")


class Rungs:
    """The rung study of one search (opened by the process that submits trials).

    Args:
        storage: the search's shared storage URL, or ``None`` for a journal file at ``journal``.
        study_name: the shared study's name (the rung study is ``study_name + ".rungs"``).
        journal: the journal file used without shared storage.
        reduction, min_validations, rule: see :class:`RungTicket`.
    """

    def __init__(self, storage: str | None, study_name: str | None, journal: Path, *, reduction: int,
                 min_validations: int, rule: str = "asha") -> None:
        if reduction < 2 or min_validations < 1:
            raise ValueError(f"successive halving needs reduction >= 2 and min_validations >= 1, "
                             f"got {reduction} and {min_validations}")
        if rule not in RULES:
            raise ValueError(f"pruning rule must be one of {RULES}, got {rule!r}")
        self.reduction, self.min_validations, self.rule = reduction, min_validations, rule
        if storage is None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            self.location, self.study_name = f"journal:{journal}", "rungs"
            self.study = _optuna.open_study(_storage(self.location), self.study_name, ["minimize"])
        else:
            self.location, self.study_name = storage, f"{study_name}{RUNG_SUFFIX}"
            from rankitect.search.shared import SharedStudy

            self.study = SharedStudy(storage, self.study_name).open(["minimize"])
        self._numbers: dict[int, int] = {}  # trial id -> number

    def ticket(self, name: str, *, prune: bool = True) -> RungTicket:
        """A new RUNNING trial for the training of ``name``."""
        trial = self.study.ask()
        trial.set_user_attr("name", name)
        self._numbers[trial._trial_id] = trial.number
        return RungTicket(self.location, self.study_name, trial._trial_id, self.reduction, self.min_validations, prune,
                          self.rule)

    def close(self, ticket: RungTicket, result: TrialResult) -> None:
        """Finish the ticket's trial as COMPLETE (its best validation NE), PRUNED or FAIL."""
        optuna = _optuna.import_optuna()
        states = optuna.trial.TrialState
        number = self._numbers.pop(ticket.trial_id)
        if result.ok:
            self.study.tell(number, float(result.val_ne))
        else:
            self.study.tell(number, state=states.PRUNED if result.pruned else states.FAIL)
