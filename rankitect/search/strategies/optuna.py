"""The family of strategies over Optuna's samplers and the space's flat choices: :class:`OptunaStrategy`,
which ``tpe`` (:mod:`~rankitect.search.strategies.tpe`) and ``nsga2``
(:mod:`~rankitect.search.strategies.nsga2`) extend with their sampler.

Each ask starts an Optuna trial, suggests every labelled choice with ``suggest_categorical`` and
decodes the suggestion; each tell completes that trial with its values, or marks it FAIL. The
sampler is rebuilt at every ask, seeded from the strategy's own generator, so that the study's
trials plus that generator are the whole state (a restored strategy continues exactly).

A suggestion whose genotype was already proposed is not handed out: the duplicate trial is marked
FAIL with a ``duplicate_of`` attribute (FAIL, not a copy of the earlier values, so the sampler's
model does not count one point twice) and the ask tries again with a fresh seed. A converged
model keeps suggesting what it already has, so after ``model_tries`` duplicates in one ask the
remaining tries are uniform samples (random search's exploration, Optuna's ``RandomSampler``).
Baselines trained before the search are added to the study as its first finished trials
(:meth:`OptunaStrategy.observe`); they take none of the trial budget.

By default the study lives in memory and the ``state_dict`` holds its trials. Given a
:class:`~rankitect.search.running.shared_study.SharedStudy` (the runner hands one over with ``search.storage``,
an Optuna RDB URL: ``sqlite:///search.db``, ``postgresql://...``) the study is shared: several
processes, on one or many machines, ask and tell into it, and the ``state_dict`` keeps only this
process's running trials. TPE runs with ``constant_liar`` so that trials running
elsewhere push suggestions away from themselves.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import rankitect.search._optuna as _optuna
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Space, SpaceExhausted, Strategy, arch_hash
from rankitect.search.running.shared_study import SharedStudy, proposal_lock

if TYPE_CHECKING:
    from rankitect.space import Architecture


class OptunaStrategy(Strategy):
    """Shared ask/tell over an Optuna study; subclasses give the sampler and the trial's values.

    Args:
        space, seed, objective: see :class:`~rankitect.search.base.Strategy`.
        shared: the study shared with other processes; ``None`` keeps it in memory.
        max_retries: duplicate suggestions per ask before giving up with ``SpaceExhausted``.
    """

    directions: ClassVar[list[str]]
    model_tries: ClassVar[int] = 10  # sampler suggestions per ask before uniform ones

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, shared: SharedStudy | None = None,
        max_retries: int = 100,
    ) -> None:
        super().__init__(space, seed=seed, objective=objective)
        if max_retries < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries}")
        self.shared, self.max_retries = shared, max_retries
        in_memory = shared is None
        self.study = _optuna.open_study(None, None, self.directions) if in_memory else shared.open(self.directions)
        self._pending: dict[str, int] = {}  # genotype hash -> trial number

    @abstractmethod
    def make_sampler(self, seed: int) -> Any:
        """The Optuna sampler for one ask."""

    @abstractmethod
    def values(self, result: TrialResult) -> list[float]:
        """The values an ok trial is completed with, one per direction."""

    def ask(self) -> Architecture:
        optuna = _optuna.import_optuna()
        for attempt in range(self.max_retries):
            seed = int(self.rng.integers(2**31 - 1))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                uniform = attempt >= self.model_tries
                self.study.sampler = optuna.samplers.RandomSampler(seed) if uniform else self.make_sampler(seed)
            with proposal_lock(self.shared):  # no other process proposes between known and ask
                known = self._known()
                trial = self.study.ask()
                sample = {label: trial.suggest_categorical(label, c.options) for label, c in self.space.choices.items()}
                arch = self.space.decode(sample)
                h = arch_hash(arch)
                trial.set_user_attr(_optuna.HASH_ATTR, h)
            earlier = known.get(h)
            if earlier is None:
                self._pending[h] = trial.number
                return arch
            trial.set_user_attr(_optuna.DUPLICATE_ATTR, earlier.number)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise SpaceExhausted(f"{self.name}: {self.max_retries} suggestions in a row were already proposed")

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        h = arch_hash(arch)
        if h not in self._pending:
            raise ValueError(f"told architecture {h} that was not asked (or was told already)")
        number = self._pending.pop(h)
        if result.ok:
            self.study.tell(number, self.values(result))
        else:
            optuna = _optuna.import_optuna()
            state = optuna.trial.TrialState.PRUNED if result.pruned else optuna.trial.TrialState.FAIL
            self.study.tell(number, state=state)

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Add a trained baseline to the study as a finished trial (outside the trial budget), so the
        sampler's first model already holds it."""
        sample = self.space.encode(arch)
        h = arch_hash(arch)
        if sample is None or h in self._known():
            return False
        optuna = _optuna.import_optuna()
        states = optuna.trial.TrialState
        dists = _optuna.distributions(self.space)
        self.study.add_trial(optuna.trial.create_trial(
            state=states.COMPLETE if result.ok else states.FAIL, params=sample, distributions=dists,
            values=self.values(result) if result.ok else None,
            user_attrs={_optuna.HASH_ATTR: h, _optuna.BASELINE_ATTR: True},
        ))
        return True

    def _known(self) -> dict[str, Any]:
        """Genotype hash -> the first trial that proposed it (running, complete or failed)."""
        known: dict[str, Any] = {}
        for t in self.study.get_trials(deepcopy=False):
            if _optuna.counts(t):
                known.setdefault(t.user_attrs[_optuna.HASH_ATTR], t)
        return known

    def state_dict(self) -> dict[str, Any]:
        study = _optuna.snapshot(self.study) if self.shared is None else None
        return {**super().state_dict(), "pending": dict(self._pending), "study": study}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._pending = {h: int(n) for h, n in state["pending"].items()}
        if self.shared is None:
            self.study = _optuna.open_study(None, None, self.directions)
            _optuna.restore(self.study, self.space, state["study"])
