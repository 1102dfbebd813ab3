"""The strategy protocol and the one registry of strategies.

A strategy proposes architectures and learns from their results; it never trains a candidate
(``oneshot`` and ``dnas`` train a supernet in :meth:`Strategy.start`, before their first proposal).
Every strategy is a :class:`Proposer`, and the runner's one loop is ``arch = strategy.ask()``,
train and score ``arch``, then ``strategy.tell(arch, result)`` with a
:class:`~rankitect.eval.result.TrialResult`:

>>> from rankitect.eval.result import TrialResult
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
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from rankitect.eval.objective import Objective
from rankitect.registry import Registry
from rankitect.track.names import STOPPED as STOPPED_TAG

if TYPE_CHECKING:
    from rankitect.eval.result import TrialResult
    from rankitect.space import Architecture



class SpaceExhausted(RuntimeError):
    """A strategy found no architecture it has not proposed before within its retry budget."""


class LabelledOptions(Protocol):
    """What a strategy reads of one choice of a space (``rankitect.space.space.Choice``): its label
    and the options it may take."""

    label: str
    options: tuple[Any, ...]


class Space(Protocol):
    """What a strategy needs from a search space (``rankitect.space.SearchSpace`` provides it)."""

    choices: dict[str, LabelledOptions]

    def sample(self, rng: np.random.Generator) -> dict[str, Any]: ...

    def decode(self, sample: dict[str, Any]) -> Architecture: ...

    def encode(self, arch: Architecture) -> dict[str, Any] | None: ...

    def mutate(self, arch: Architecture, rng: np.random.Generator, num_mutations: int = 1) -> Architecture: ...


def arch_hash(arch: Architecture) -> str:
    """The stable genotype hash of ``arch`` (a property or a method on the architecture)."""
    h = arch.hash
    return str(h() if callable(h) else h)


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
    "STOPPED_TAG",
    "STRATEGIES",
    "LabelledOptions",
    "Proposer",
    "SearchContext",
    "Space",
    "SpaceExhausted",
    "Strategy",
    "arch_hash",
    "build_strategy",
    "register_strategy",
    "strategy_options",
]
