"""A surrogate of validation NE over a space's flat choices: which proposals are worth training.

Every finished trial the strategy sees (its own, the baselines it observed, pruned ones included)
is one observation; each proposal then draws ``candidates`` architectures (samples, mutations of
the tournament winner; the climb of ``dnas`` takes every untried change of its origin) and trains
the one the surrogate ranks best.

Features of an architecture (:class:`Features`): for every label its decode reads, one column per
option (1 where it holds that option, so an inactive label adds nothing); for a choice of three or
more numeric options also its position among them (0 to 1, so that widths are ordered); the log2
of its MFLOPs where they are known for every observation and candidate; and ``shortfall``, the
fraction of a typical full training a trial missed (a pruned trial's last validation NE with its
step count: weaker evidence of a worse NE, by how much the fit learns), which candidates are
predicted at 0, fully trained. Pruned observations also weigh ``PRUNED_WEIGHT`` of a full one.

The model (:class:`RidgeEnsemble`) is ``members`` ridge regressions (intercept unpenalized), each on
a bootstrap of the observations; their mean is the prediction and their spread its uncertainty. A
candidate's rank is the objective of its lower confidence bound, ``mean - kappa * spread``, at its
own FLOPs: an option seldom tried keeps a wide spread and so a chance to be trained (exploration),
one tried often is judged by its mean. The fit is a pure function of the observations (each
member's bootstrap is seeded by the seed, the count of observations and the member), so a strategy
stays deterministic under its seed and resumes exactly from the observations in its state.

>>> from rankitect.space import get_space
>>> space = get_space("nasrec", num_blocks=2, widths=(16, 32), tokens=(4, 8), recipe={})  # wiring alone
>>> def val_ne(arch):  # planted: a dot product as block 0's flat op is 0.05 better
...     return 0.80 - 0.05 * (space.encode(arch)["b0.flat"] == "dot")
>>> rng = np.random.default_rng(0)
>>> archs = [space.decode(space.sample(rng)) for _ in range(24)]
>>> guide = Guide(space, seed=0, candidates=4, min_trials=4)
>>> for a in archs[:16]:
...     _ = guide.observe(a, TrialResult(val_ne=val_ne(a), mflops=1.0))
>>> guide.ready(), guide.width()
(True, 4)
>>> fresh = archs[16:]
>>> sorted({space.encode(a)["b0.flat"] for a in fresh})
['dot', 'gating', 'mlp', 'sum']
>>> space.encode(fresh[guide.choose(fresh, Objective())])["b0.flat"]
'dot'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rankitect.config_rules import check_section
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Space, arch_hash

if TYPE_CHECKING:
    from rankitect.config import SurrogateConfig
    from rankitect.space import Architecture

RIDGE = 0.3  # penalty on each choice's coefficients; columns are 0/1 or standardized, so one scale serves all
NUISANCE = 1e-6  # penalty on the shortfall's coefficient: learnt from the data, not shrunk towards 0
PRUNED_WEIGHT = 0.5  # a pruned curve's weight beside a fully trained one
MEMBERS = 8  # ridge models in the ensemble


@dataclass(frozen=True)
class Observation:
    """One finished trial: its flat sample, validation NE, MFLOPs (None: unknown), steps and status."""

    hash: str
    sample: dict[str, Any]
    ne: float
    mflops: float | None
    steps: int | None
    pruned: bool

    def to_list(self) -> list[Any]:
        return [self.hash, self.sample, self.ne, self.mflops, self.steps, self.pruned]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Observation:
        h, sample, ne, mflops, steps, pruned = row
        return cls(str(h), dict(sample), float(ne), None if mflops is None else float(mflops),
                   None if steps is None else int(steps), bool(pruned))


class RidgeEnsemble:
    """``members`` ridge regressions on weighted bootstraps: ``predict`` gives mean and spread.

    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]]); y = 2.0 * X[:, 0] + 1.0
    >>> model = RidgeEnsemble(ridge=1e-9, members=4).fit(X, y, np.ones(4), rng_seed=[0])
    >>> mean, spread = model.predict(np.array([[4.0]]))
    >>> round(float(mean[0]), 6), bool(spread[0] < 1e-6)
    (9.0, True)
    """

    def __init__(self, *, ridge: float | np.ndarray = RIDGE, members: int = MEMBERS) -> None:
        if np.any(np.asarray(ridge) < 0) or members < 1:
            raise ValueError(f"ridge must be >= 0 and members >= 1, got {ridge}, {members}")
        self.ridge, self.members = ridge, members
        self.coefs: list[tuple[np.ndarray, float]] = []

    def fit(self, X: np.ndarray, y: np.ndarray, weights: np.ndarray, *, rng_seed: Sequence[int]) -> RidgeEnsemble:
        """Fit on rows ``X`` (n, p), targets ``y`` (n,) and row weights (n,); member ``b`` on a bootstrap
        drawn by ``default_rng([*rng_seed, b])``."""
        n = len(y)
        self.coefs = []
        for b in range(self.members):
            counts = np.bincount(np.random.default_rng([*rng_seed, b]).integers(n, size=n), minlength=n)
            w = weights * counts
            if w.sum() <= 0:
                w = weights
            self.coefs.append(_ridge(X, y, w, self.ridge))
        return self

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and spread (standard deviation across members) of the prediction of each row of ``X``."""
        preds = np.stack([X @ beta + b0 for beta, b0 in self.coefs])  # (members, n)
        return preds.mean(axis=0), preds.std(axis=0)


def _ridge(X: np.ndarray, y: np.ndarray, w: np.ndarray, ridge: float | np.ndarray) -> tuple[np.ndarray, float]:
    """Weighted ridge regression with an unpenalized intercept: ``(beta, intercept)``; ``ridge`` is
    one penalty or one per column."""
    total = w.sum()
    x_mean = (w[:, None] * X).sum(axis=0) / total  # (p,)
    y_mean = float((w * y).sum() / total)
    Xc, yc = X - x_mean, y - y_mean  # (n, p), (n,)
    gram = Xc.T @ (w[:, None] * Xc) + np.diag(np.broadcast_to(ridge, X.shape[1]))  # (p, p)
    beta = np.linalg.solve(gram, Xc.T @ (w * yc)) if X.shape[1] else np.zeros(0)
    return beta, y_mean - float(x_mean @ beta)


class Features:
    """Columns of a flat sample: one-hot options of the labels read, numeric positions, log2 MFLOPs
    (standardized over the observations), the shortfall of training."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.columns: dict[tuple[str, int], int] = {}
        self.ordinal: dict[str, int] = {}
        for label, choice in space.choices.items():
            for i in range(len(choice.options)):
                self.columns[(label, i)] = len(self.columns)
        for label, choice in space.choices.items():
            numeric = [o for o in choice.options if isinstance(o, (int, float)) and not isinstance(o, bool)]
            if len(numeric) == len(choice.options) >= 3:
                self.ordinal[label] = len(self.columns) + len(self.ordinal)
        self.width = len(self.columns) + len(self.ordinal)

    def active(self, sample: dict[str, Any]) -> list[str]:
        """The labels a decode of ``sample`` reads (every label where the space does not say)."""
        active = getattr(self.space, "active", None)
        return list(active(sample)) if active is not None else list(self.space.choices)

    def row(self, sample: dict[str, Any]) -> np.ndarray:
        x = np.zeros(self.width)
        for label in self.active(sample):
            options = self.space.choices[label].options
            i = next(k for k, o in enumerate(options) if type(o) is type(sample[label]) and o == sample[label])
            x[self.columns[(label, i)]] = 1.0
            if label in self.ordinal:
                order = sorted(options)
                x[self.ordinal[label]] = order.index(sample[label]) / (len(order) - 1)
        return x


class Guide:
    """The surrogate as a strategy uses it: observe finished trials, choose among candidates.

    Args:
        space: the search space (its ``choices``, ``encode`` and, where it has one, ``active``).
        seed: seeds the bootstraps (with the count of observations).
        candidates: architectures drawn per proposal once the surrogate is ready (1: no ranking).
        kappa: spreads subtracted from the mean (lower confidence bound); 0 ranks by the mean.
        min_trials: observations before the surrogate ranks (fewer: the first drawn is trained).
        price: MFLOPs of an architecture as the search prices it (None: FLOPs are no feature and
            candidates rank by NE alone); see :meth:`use_data`.
    """

    def __init__(self, space: Space, *, seed: int, candidates: int = 8, kappa: float = 1.0, min_trials: int = 4,
                 price: Callable[[Any], float] | None = None) -> None:
        if candidates < 1 or kappa < 0 or min_trials < 2:
            raise ValueError(f"candidates must be >= 1, kappa >= 0, min_trials >= 2; got {candidates}, {kappa}, "
                             f"{min_trials}")
        self.space, self.seed = space, seed
        self.candidates, self.kappa, self.min_trials = candidates, kappa, min_trials
        self.price = price
        self.features = Features(space)
        self.observations: list[Observation] = []
        self.predictions: dict[str, tuple[float, float]] = {}  # hash -> (mean, spread) of each chosen one
        self._model: RidgeEnsemble | None = None
        self._fitted_on = -1  # observations the model was fitted on
        self._flops: tuple[float, float] | None = None  # mean and std of log2 MFLOPs, when a column

    @classmethod
    def from_config(cls, space: Space, seed: int, cfg: SurrogateConfig | None) -> Guide | None:
        """The guide of ``search.surrogate`` (None when it is off or not given); a section given
        directly is checked against the config's one range table, as a loaded one is."""
        if cfg is None or not cfg.enabled:
            return None
        check_section(cfg, "search.surrogate")
        return cls(space, seed=seed, candidates=cfg.candidates, kappa=cfg.kappa, min_trials=cfg.min_trials)

    def use_data(self, data: Any) -> None:
        """Price candidates as the search does (:func:`~rankitect.cost.measure`, served at the test
        split's fan-out where ROCS-masked), once per architecture."""
        from rankitect.cost import measure
        from rankitect.search.running.trial import candidates_per_request

        cache: dict[str, float] = {}

        def price(arch: Any) -> float:
            if arch.hash not in cache:
                fan_out = candidates_per_request(data) if getattr(arch, "rocs", False) else None
                cache[arch.hash] = measure(arch, data.spec, fan_out).served_mflops
            return cache[arch.hash]

        self.price = price

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Learn from a finished trial (ok, or pruned with a validation NE) of an architecture the
        space holds, once per genotype; returns whether it was taken."""
        h = arch_hash(arch)
        if result.val_ne is None or not math.isfinite(result.val_ne) or not (result.ok or result.pruned):
            return False
        if any(o.hash == h for o in self.observations):
            return False
        sample = self.space.encode(arch)
        if sample is None:
            return False
        self.observations.append(Observation(h, sample, float(result.val_ne), result.mflops, result.steps,
                                             result.pruned))
        return True

    def ready(self) -> bool:
        """Whether there are enough observations (with some spread in NE) to rank by."""
        nes = {o.ne for o in self.observations}
        return len(self.observations) >= self.min_trials and len(nes) > 1

    def width(self) -> int:
        """How many candidates a proposal draws now: ``candidates`` once ready, else 1."""
        return self.candidates if self.ready() else 1

    def predict(self, archs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Predicted validation NE of ``archs`` fully trained: mean and spread, one each."""
        self._fit()
        X = np.stack([self._row(self.space.encode(a), self._log_mflops(a), 0.0) for a in archs])
        return self._model.predict(X)

    def choose(self, archs: Sequence[Any], objective: Objective) -> int:
        """The index of the candidate whose lower confidence bound has the best objective (the
        first on ties); its prediction is kept in :attr:`predictions`. The first when not ready."""
        if len(archs) == 1 or not self.ready():
            return 0
        mean, spread = self.predict(archs)
        bound = mean - self.kappa * spread
        values = [objective.value(b, self.price(a)) if self.price is not None else float(b)
                  for a, b in zip(archs, bound)]
        best = int(np.argmin(values))
        self.predictions[arch_hash(archs[best])] = (float(mean[best]), float(spread[best]))
        return best

    def _log_mflops(self, arch: Any) -> float | None:
        return math.log2(max(self.price(arch), 1e-9)) if self._flops is not None else None

    def _row(self, sample: dict[str, Any], log_mflops: float | None, shortfall: float) -> np.ndarray:
        extra = [shortfall]
        if self._flops is not None:
            mean, std = self._flops
            extra.append((log_mflops - mean) / std)
        return np.concatenate([self.features.row(sample), extra])

    def _fit(self) -> None:
        obs = self.observations
        if self._model is not None and self._fitted_on == len(obs):
            return
        with_flops = self.price is not None and all(o.mflops is not None and o.mflops > 0 for o in obs)
        self._flops = None
        if with_flops:
            logs = [math.log2(o.mflops) for o in obs]
            self._flops = (statistics.fmean(logs), statistics.pstdev(logs) or 1.0)
        full = [o.steps for o in obs if not o.pruned and o.steps]
        typical = statistics.median(full) if full else None
        X = np.stack([self._row(o.sample, math.log2(o.mflops) if with_flops else None, _shortfall(o, typical))
                      for o in obs])
        y = np.array([o.ne for o in obs])
        w = np.array([PRUNED_WEIGHT if o.pruned else 1.0 for o in obs])
        penalty = np.full(X.shape[1], RIDGE)
        penalty[self.features.width] = NUISANCE  # the shortfall, the first column after the choices
        self._model = RidgeEnsemble(ridge=penalty, members=MEMBERS).fit(X, y, w, rng_seed=[self.seed, len(obs)])
        self._fitted_on = len(obs)

    def state_dict(self) -> dict[str, Any]:
        return {"observations": [o.to_list() for o in self.observations],
                "predictions": {h: list(p) for h, p in self.predictions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.observations = [Observation.from_list(row) for row in state.get("observations", [])]
        self.predictions = {h: (float(m), float(s)) for h, (m, s) in state.get("predictions", {}).items()}
        self._model, self._fitted_on = None, -1


class Guided:
    """What a strategy with an optional :class:`Guide` (``self.guide``, None: off) shares."""

    guide: Guide | None
    objective: Objective

    def candidates_now(self) -> int:
        """Candidates the next proposal draws: the guide's width, 1 without one."""
        return self.guide.width() if self.guide is not None else 1

    def pick(self, archs: Sequence[Any]) -> int:
        """The index among ``archs`` to train: the guide's choice, the first without one."""
        return self.guide.choose(archs, self.objective) if self.guide is not None else 0

    def learn(self, arch: Any, result: TrialResult) -> None:
        """Hand a finished trial to the guide (if any)."""
        if self.guide is not None:
            self.guide.observe(arch, result)

    @property
    def predictions(self) -> dict[str, tuple[float, float]]:
        """Predicted validation NE (mean, spread) of each architecture the guide chose, by hash;
        the runner logs it beside the measured one."""
        return self.guide.predictions if self.guide is not None else {}

    def guide_state(self) -> dict[str, Any]:
        return {"surrogate": self.guide.state_dict()} if self.guide is not None else {}

    def load_guide_state(self, state: dict[str, Any]) -> None:
        if self.guide is not None and "surrogate" in state:
            self.guide.load_state_dict(state["surrogate"])


def _shortfall(o: Observation, typical: float | None) -> float:
    """The fraction of a typical full training (median steps of the fully trained) ``o`` missed."""
    if not o.pruned:
        return 0.0
    if typical is None or not o.steps:
        return 1.0
    return max(0.0, 1.0 - o.steps / typical)


__all__ = ["Features", "Guide", "Guided", "Observation", "RidgeEnsemble"]
