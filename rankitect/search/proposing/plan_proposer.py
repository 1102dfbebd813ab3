"""Proposers with a phase of their own: a supernet trained first, then what it chose, one by one.

``oneshot`` and ``dnas`` are such proposers. The runner calls :meth:`PlanProposer.start` once,
after the baselines: the proposer trains its supernet (:meth:`PlanProposer.search`) and keeps the
architectures it chose as its *plan*; each ask then hands out the next planned architecture not
yet recorded, to be trained from scratch like any candidate. The plan is part of the
``state_dict``, so a resumed search retrains what is left of it and trains no supernet again.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from rankitect.config_rules import check_section
from rankitect.errors import ConfigError
from rankitect.eval.result import TrialResult
from rankitect.search.base import STOPPED_TAG, SearchContext, SpaceExhausted, Strategy, arch_hash
from rankitect.supernet.train import CurveLogger, build_supernet, check_supernet_memory, save_supernet
from rankitect.train.protocol import BUDGET_STOP, deadline_passed

if TYPE_CHECKING:
    from rankitect.space import Architecture
    from rankitect.supernet.model import Supernet


class PlanProposer(Strategy):
    """Proposes the architectures its own :meth:`search` chose, each once (never pruned: each was
    chosen to be trained in full).

    A subclass names its section's dataclass (:attr:`config_class`); the section is checked against
    the config's one range table (:func:`~rankitect.config_rules.check_section`).

    Args:
        space, seed, objective: see :class:`~rankitect.search.base.Strategy`.
        config: the strategy's section (``search.oneshot``, ``search.dnas``); None: its defaults.
        rocs: the space is ROCS-masked (refused: no supernet holds ROCS-masked blocks yet).
        fill: plan this many architectures (``search.trials``) where that is more than
            ``config.supernet.top_k`` (see :attr:`plan_size`); 0: ``top_k``.
    """

    config_class: ClassVar[type | None] = None  # the section's dataclass, with a supernet.top_k

    prunable: ClassVar[bool] = False

    def __init__(self, space: Any, *, seed: int, objective: Any = None, config: Any = None, rocs: bool = False,
                 fill: int = 0) -> None:
        if config is None and self.config_class is not None:
            config = self.config_class()
        if config is not None:
            check_section(config, f"search.{self.name}")
        self.config = config
        if rocs:
            raise ConfigError(f"config key 'search.rocs': the {self.name} supernet holds no ROCS-masked blocks yet; "
                              "search ROCS architectures with random, evolution, tpe or nsga2")
        super().__init__(space, seed=seed, objective=objective)
        self.fill = fill
        self.plan: list[Architecture] = []
        self._done: set[str] = set()  # told, or recorded before a resume
        self._pending: set[str] = set()
        self.trained: set[str] = set()  # hashes of architectures trained outside the plan (baselines)
        self.scored: dict[str, tuple[float, Architecture]] = {}  # hash -> (objective, arch): see score
        self._echo: Any = print

    @property
    def plan_size(self) -> int:
        """Architectures to train: the section's ``supernet.top_k``, or ``fill`` where that is more (a search
        trains ``search.trials`` candidates, as a sampling strategy does: oneshot plans that many, best
        first; dnas retrains its ``top_k`` and climbs from there, :class:`~rankitect.search.strategies.dnas.DnasSearch`).
        A time budget may end the retraining before."""
        return max(self.config.supernet.top_k, self.fill)

    def budget(self, trials: int) -> int:
        return self.plan_size

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Note a trained baseline: the plan never retrains its architecture (see :meth:`untrained`)."""
        self.trained.add(arch_hash(arch))
        return False

    def score(self, arch: Architecture, result: TrialResult) -> bool:
        """Keep the objective of a trained architecture the space holds; whether it was kept."""
        if not result.ok or self.space.encode(arch) is None:
            return False
        self.scored[arch.hash] = (self.objective(result), arch)
        return True

    def ranked(self, worst_first: bool = False) -> list[Architecture]:
        """The kept architectures (:meth:`score`), best objective first (ties by hash), or worst first."""
        sign = -1.0 if worst_first else 1.0
        return [a for _, a in sorted(self.scored.values(), key=lambda va: (sign * va[0], va[1].hash))]

    def untrained(self, ranked: list[Architecture], k: int) -> list[Architecture]:
        """The first ``k`` of ``ranked`` (best first) that no baseline is; says which were skipped."""
        out = []
        for arch in ranked:
            if arch.hash in self.trained:
                self._echo(f"{self.name}: {arch.hash} is a baseline, trained already")
            elif len(out) < k:
                out.append(arch)
        return out

    @abstractmethod
    def search(self, context: SearchContext) -> list[Architecture]:
        """The supernet phase: the architectures to retrain from scratch, best first."""

    @contextmanager
    def supernet_phase(self, context: SearchContext) -> Iterator[tuple[Supernet, CurveLogger]]:
        """A supernet of the space and the curves of its ``supernet`` child run, for the phase run
        inside the ``with``. The supernet is refused before it is built when it would not fit in
        ``runtime.memory_budget`` (no run is started then); after the phase its run is tagged when
        the time budget stopped it, keeps the supernet's weights (``rankitect finetune
        --from-supernet`` cuts candidates out of them) and ends."""
        data, tracker = context.data, context.tracker
        memory = check_supernet_memory(self.space, data.spec, context.memory_budget, context.flops_range)
        context.echo(f"{self.name}: supernet estimated at {memory.describe()}")
        supernet = build_supernet(self.space, data.spec, context.seed)
        run_id = tracker.start_child_run(context.parent_run_id, "supernet", "supernet")
        curves = CurveLogger(tracker, run_id)
        yield supernet, curves
        curves.flush()
        if deadline_passed(context.deadline):
            tracker.set_tag(run_id, STOPPED_TAG, BUDGET_STOP)
        save_supernet(tracker, run_id, supernet, self.space, data.spec)
        tracker.end_run(run_id, "FINISHED")

    def start(self, context: SearchContext) -> None:
        self._echo = context.echo
        if not self.plan:
            self.plan = self.search(context)
        self._done |= {a.hash for a in self.plan} & context.finished

    def planned(self) -> list[Architecture]:
        return list(self.plan)

    def ask(self) -> Architecture:
        for arch in self.plan:
            h = arch_hash(arch)
            if h not in self._done and h not in self._pending:
                self._pending.add(h)
                self._echo(f"{self.name}: retraining {h} from scratch")
                return arch
        raise SpaceExhausted(f"{self.name}: every architecture the supernet chose was proposed")

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        h = arch_hash(arch)
        if h not in self._pending:
            raise ValueError(f"told architecture {h} that was not asked (or was told already)")
        self._pending.discard(h)
        self._done.add(h)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "plan": [a.to_dict() for a in self.plan],
                "scored": [[v, a.to_dict()] for v, a in self.scored.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from rankitect.space.architecture import Architecture

        super().load_state_dict(state)
        self.plan = [Architecture.from_dict(d) for d in state.get("plan", [])]
        for value, d in state.get("scored", []):
            arch = Architecture.from_dict(d)
            self.scored[arch.hash] = (float(value), arch)
