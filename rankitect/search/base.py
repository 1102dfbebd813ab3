"""The strategy protocol, the result of one trial, and the one registry of strategies.

A strategy proposes architectures and learns from their results; it never trains a candidate
(``oneshot`` and ``dnas`` train a supernet in :meth:`Strategy.start`, before their first proposal).
Every strategy is a :class:`Proposer`, and the runner's one loop is ``arch = strategy.ask()``,
train and score ``arch``, then ``strategy.tell(arch, result)`` with a :class:`TrialResult`:

>>> from rankitect.search import build_strategy
>>> from rankitect.space import get_space
>>> strategy = build_strategy("evolution", get_space("nasrec"), seed=0, population=8, sample_size=2)
>>> arch = strategy.ask()
>>> strategy.tell(arch, TrialResult(val_ne=0.80, test_ne=0.81, mflops=1.5))
>>> other = strategy.ask()
>>> strategy.tell(other, TrialResult.failure("loss is NaN at step 40"))
>>> restored = build_strategy("evolution", get_space("nasrec"), seed=0, population=8, sample_size=2)
>>> restored.load_state_dict(strategy.state_dict())  # e.g. from a checkpoint, after a restart
>>> restored.ask() == strategy.ask()
True

Several asks may be outstanding at once (a pool of workers); each is told exactly once, failed
trials included (``TrialResult.failure(...)``). Every strategy owns one ``numpy.random.Generator``
seeded from ``seed``: the same seed and the same told results give the same architectures, and
:meth:`Strategy.state_dict` (plain JSON data) captures everything needed to continue.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from rankitect.registry import Registry
from rankitect.search.objective import Objective
from rankitect.track.names import STOPPED as STOPPED_TAG

if TYPE_CHECKING:
    from rankitect.cost import Cost
    from rankitect.space import Architecture

STATUSES = ("ok", "failed", "pruned")


class SpaceExhausted(RuntimeError):
    """A strategy found no architecture it has not proposed before within its retry budget."""


class Choice(Protocol):
    label: str
    options: tuple[Any, ...]


class Space(Protocol):
    """What a strategy needs from a search space (``rankitect.space.SearchSpace`` provides it)."""

    choices: dict[str, Choice]

    def sample(self, rng: np.random.Generator) -> dict[str, Any]: ...

    def decode(self, sample: dict[str, Any]) -> Architecture: ...

    def encode(self, arch: Architecture) -> dict[str, Any] | None: ...

    def mutate(self, arch: Architecture, rng: np.random.Generator, num_mutations: int = 1) -> Architecture: ...


def arch_hash(arch: Architecture) -> str:
    """The stable genotype hash of ``arch`` (a property or a method on the architecture)."""
    h = arch.hash
    return str(h() if callable(h) else h)


@dataclass(frozen=True)
class TrialResult:
    """The outcome of training and scoring one architecture.

    Args:
        status: ``"ok"``, ``"failed"`` (diverged, crashed, out of memory ...) or ``"pruned"``
            (stopped early by the search's successive halving; its budget slot is given back).
        val_ne: NE on the validation split (of the best validation); what strategies rank by.
            Required when ok; a pruned trial's is the best before it was stopped.
        test_ne, test_auc, test_logloss: held-out metrics, reported only.
        mflops: forward MFLOPs per example as served (``cost.served_mflops``). Required when ok.
        params: number of model parameters.
        cost: the candidate's :class:`~rankitect.cost.Cost` (plain and ROCS FLOPs, parameters),
            measured once before training; ``None`` when it was never built.
        train_seconds: wall time of training.
        error: why a failed trial failed.
        steps: training steps taken; best_step: the step of the best validation (an ok trial's).
        stopped: why training ended early though the trial is ok (``"time budget"``: the search's
            deadline; its best validation so far is its result), ``None`` when it ran to its end.
    """

    status: str = "ok"
    val_ne: float | None = None
    test_ne: float | None = None
    test_auc: float | None = None
    test_logloss: float | None = None
    mflops: float | None = None
    params: int | None = None
    train_seconds: float | None = None
    error: str | None = None
    steps: int | None = None  # training steps taken
    cost: Cost | None = None
    best_step: int | None = None  # the step of the best validation
    stopped: str | None = None  # e.g. "time budget": cut short by the search's deadline

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"TrialResult status must be one of {STATUSES}, got {self.status!r}")
        if self.ok:
            for name in ("val_ne", "mflops"):
                value = getattr(self, name)
                if value is None or not math.isfinite(value):
                    raise ValueError(f"an ok TrialResult needs a finite {name}, got {value!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failure(
        cls, error: str, *, mflops: float | None = None, params: int | None = None,
        train_seconds: float | None = None, cost: Cost | None = None,
    ) -> TrialResult:
        """A failed trial with its error message (and whatever was known before it failed)."""
        return cls(status="failed", error=error, mflops=mflops, params=params, train_seconds=train_seconds, cost=cost)

    @property
    def pruned(self) -> bool:
        return self.status == "pruned"

    @classmethod
    def pruning(
        cls, error: str, *, val_ne: float | None, mflops: float | None, params: int | None,
        train_seconds: float | None, steps: int | None, cost: Cost | None = None,
    ) -> TrialResult:
        """A pruned trial: why, its best validation NE so far and what it cost."""
        val_ne = val_ne if val_ne is not None and math.isfinite(val_ne) else None
        return cls(status="pruned", error=error, val_ne=val_ne, mflops=mflops, params=params,
                   train_seconds=train_seconds, steps=steps, cost=cost)

    @classmethod
    def from_metrics(
        cls, metrics: dict[str, float], *, mflops: float, params: int | None = None,
        train_seconds: float | None = None, steps: int | None = None, cost: Cost | None = None,
        best_step: int | None = None, stopped: str | None = None,
    ) -> TrialResult:
        """From the ``val/*``, ``test/*`` metrics dict of ``rankitect.train.loop.train_model``."""
        return cls(
            val_ne=metrics["val/ne"], test_ne=metrics.get("test/ne"), test_auc=metrics.get("test/auc"),
            test_logloss=metrics.get("test/logloss"), mflops=mflops, params=params,
            train_seconds=train_seconds, steps=steps, cost=cost, best_step=best_step, stopped=stopped,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrialResult keys {unknown}; known: {sorted(known)}")
        if isinstance(d.get("cost"), dict):
            from rankitect.cost import Cost

            d = {**d, "cost": Cost(**d["cost"])}
        return cls(**d)


@dataclass
class SearchContext:
    """What the runner hands every proposer once, before the first ask (:meth:`Strategy.start`).

    A sampling strategy needs none of it; a proposer with a phase of its own (a supernet to train:
    ``oneshot``, ``dnas``) trains on ``data`` and logs under the search's parent run.

    Args:
        data: the search's data set (``split("train")``, ``split("val")``, ``spec``).
        train_cfg: the candidates' training settings.
        seed: the search's seed.
        memory_budget: ``runtime.memory_budget`` (GB) a supernet must fit in.
        flops_range: ``search.flops_range`` (what the space was sized to).
        tracker: the search's :class:`~rankitect.track.Tracker`.
        parent_run_id: the search's parent run.
        finished: genotype hashes of the candidates the search has recorded (on resume: already done).
        echo: one line of progress.
        progress: whether to draw progress bars.
        deadline: the ``time.time()`` instant the search's time budget runs out (``None``: no
            budget): a supernet phase still running then stops there and goes on with what it has.
        on_step: ``(step, steps)`` after every supernet step, for the search's progress display.
    """

    data: Any
    train_cfg: Any
    seed: int
    memory_budget: float | None
    flops_range: Any
    tracker: Any
    parent_run_id: str
    finished: set[str] = field(default_factory=set)
    echo: Callable[[str], None] = print
    progress: bool = False
    deadline: float | None = None
    on_step: Callable[[int, int], None] | None = None


class Proposer(Protocol):
    """What the runner's loop needs of a strategy: propose, learn, and be checkpointed.

    :class:`Strategy` implements it; so does every registered strategy, ``oneshot`` and ``dnas``
    included (they train their supernet in :meth:`start`, then propose what it chose).
    """

    name: str
    objective: Objective
    prunable: bool

    def start(self, context: SearchContext) -> None: ...

    def budget(self, trials: int) -> int: ...

    def ask(self) -> Architecture: ...

    def tell(self, arch: Architecture, result: TrialResult) -> None: ...

    def observe(self, arch: Architecture, result: TrialResult) -> bool: ...

    def planned(self) -> list[Architecture]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Strategy(ABC):
    """Proposes architectures (``ask``) and learns from their results (``tell``).

    Args:
        space: the search space (see :class:`Space`).
        seed: seeds the strategy's own ``numpy.random.Generator``.
        objective: ranks results (NE plus a FLOPs penalty); NE alone when omitted.
    """

    name: ClassVar[str]
    prunable: ClassVar[bool] = True  # its candidates may be stopped early by successive halving

    def __init__(self, space: Space, *, seed: int, objective: Objective | None = None) -> None:
        self.space = space
        self.seed = seed
        self.objective = objective if objective is not None else Objective()
        self.rng = np.random.default_rng(seed)

    def start(self, context: SearchContext) -> None:
        """Called by the runner once before the first ask (after the baselines); nothing by default."""

    def budget(self, trials: int) -> int:
        """How many candidates to train, given ``search.trials``: that many by default."""
        return trials

    def planned(self) -> list[Architecture]:
        """Architectures chosen before they are proposed (by a supernet phase), checkpointed by the
        runner and retrained from scratch; none by default."""
        return []

    @abstractmethod
    def ask(self) -> Architecture:
        """The next architecture to train; raises :class:`SpaceExhausted` when none is new."""

    @abstractmethod
    def tell(self, arch: Architecture, result: TrialResult) -> None:
        """Report the result of an architecture this strategy proposed (ok or failed)."""

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Learn from an architecture trained outside the strategy (a baseline) as if it had been
        proposed and told: the search then starts from it. Returns whether it was taken (it lies in
        the space and is new to the strategy); the default strategy takes nothing."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue, as JSON-serializable data."""
        return {"strategy": self.name, "seed": self.seed, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a strategy built with the same space and options."""
        if state.get("strategy") != self.name:
            raise ValueError(f"state of strategy {state.get('strategy')!r} loaded into {self.name!r}")
        self.rng.bit_generator.state = state["rng"]


STRATEGIES: Registry[type[Strategy]] = Registry("strategy", base=Strategy)


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator adding a strategy to :data:`STRATEGIES`; a second one of a name is an error."""

    def wrap(cls: type[Strategy]) -> type[Strategy]:
        STRATEGIES.add(name, cls)
        cls.name = name
        return cls

    return wrap


def strategy_options(name: str) -> dict[str, inspect.Parameter]:
    """The keyword options strategy ``name`` accepts beyond ``seed`` and ``objective``."""
    sig = inspect.signature(STRATEGIES[name].__init__)  # an unknown name: a ValueError listing the known ones
    return {
        n: p for n, p in sig.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("seed", "objective")
    }


def build_strategy(
    name: str, space: Space, *, seed: int, objective: Objective | None = None, **options: Any
) -> Strategy:
    """Construct strategy ``name``; an option it does not accept raises ``ValueError`` naming it."""
    accepted = strategy_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"strategy {name!r}: unknown options {unknown}; accepted: {sorted(accepted)}")
    return STRATEGIES[name](space, seed=seed, objective=objective, **options)


__all__ = [
    "STRATEGIES",
    "Proposer",
    "SearchContext",
    "Space",
    "SpaceExhausted",
    "Strategy",
    "TrialResult",
    "arch_hash",
    "build_strategy",
    "register_strategy",
    "strategy_options",
]
