"""Regularized (aging) evolution (Real et al., AAAI 2019, arXiv 1802.01548).

The population is the ``population`` most recently finished trials. Until that many have
finished, asks are uniform samples (the random initial population). After that each ask runs a
tournament: ``sample_size`` members drawn without replacement, the one with the lowest objective
wins, and the child is ``space.mutate(winner)``. A child whose genotype was proposed before is rejected and the
tournament repeated (NASRec); after ``max_retries`` rejections the ask falls back to a new uniform
sample. Ageing needs no bookkeeping: a trial leaves the population when ``population`` newer
ones have finished, whatever its score.

Only trials that were trained to the end are members: a failed or pruned trial (objective
``inf``, or a partial curve) neither enters the population nor ages anyone out of it. Counting
them would let a run of early-stopped candidates push every trained model out, after which
tournaments draw only from stopped ones and evolution degrades to mutating what the pruner just
rejected. Once ``population`` trials have finished in any state, the tournament draws from the
``population`` most recent trained ones (``min(sample_size, len(members))`` of them).

Baselines the runner trained first are *observed* (:meth:`RegularizedEvolution.observe`): they enter
the history as finished members, so the random initial population is that much smaller and the
first tournaments already mutate the best hand-built model.

With a surrogate (``search.surrogate``, :mod:`rankitect.search.proposing.surrogate`) a tournament's winner is
mutated ``candidates`` times and the child the surrogate ranks best is trained (and the random
initial population is drawn the same way, ``candidates`` samples per ask): the surrogate, fitted
on every finished trial, baselines and pruned ones included, spends the training on the most
promising children; its lower confidence bound keeps options seldom tried in play.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rankitect.eval.objective import Objective
from rankitect.search.base import Space, SpaceExhausted, Strategy, arch_hash, register_strategy
from rankitect.search.proposing.history import Record, make_history
from rankitect.search.running.shared_study import SharedStudy
from rankitect.search.strategies.random import GuidedHistory, draw_new
from rankitect.search.proposing.surrogate import Guide

if TYPE_CHECKING:
    from rankitect.config import SurrogateConfig
    from rankitect.space import Architecture


@register_strategy("evolution")
class RegularizedEvolution(GuidedHistory, Strategy):
    """Aging evolution with tournament selection and duplicate rejection by genotype hash.

    Args:
        space, seed, objective: see :class:`~rankitect.search.base.Strategy`.
        population: size ``P`` of the population (and of the random initial population).
        sample_size: tournament size ``S`` (at most ``P``).
        num_mutations: choices changed per mutation.
        max_retries: rejected children (or random samples) per ask before giving up.
        shared: share history and population with other processes through this study (see
            :mod:`rankitect.search.proposing.history`; the runner hands it over, :mod:`rankitect.search.running.shared_study`).
        surrogate: ``search.surrogate``: rank ``candidates`` children (or samples) per ask (None or
            disabled: one).
    """

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, population: int = 8,
        sample_size: int = 4, num_mutations: int = 1, max_retries: int = 100,
        shared: SharedStudy | None = None, surrogate: SurrogateConfig | None = None,
    ) -> None:
        super().__init__(space, seed=seed, objective=objective)
        if population < 1:
            raise ValueError(f"population must be >= 1, got {population}")
        if not 1 <= sample_size <= population:
            raise ValueError(f"sample_size must be in [1, population={population}], got {sample_size}")
        if num_mutations < 1 or max_retries < 1:
            raise ValueError(f"num_mutations and max_retries must be >= 1, got {num_mutations}, {max_retries}")
        self.population, self.sample_size = population, sample_size
        self.num_mutations, self.max_retries = num_mutations, max_retries
        self.history = make_history(space, shared)
        self.guide = Guide.from_config(space, seed, surrogate)

    def ask(self) -> Architecture:
        for _ in range(self.max_retries):  # start() refuses a genotype another process just took
            finished, seen = self.history.finished(), self.history.seen()
            found = None
            members = [r for r in finished if math.isfinite(r.value)][-self.population:]
            if len(finished) >= self.population and members:
                found = self._mutate_new(members, seen)
            if found is None:
                drawn = draw_new(self.space, self.rng, seen, self.max_retries, self.candidates_now())
                found = drawn[self.pick([d[0] for d in drawn])]
            arch, h, sample = found
            if self.history.start(h, sample):
                return arch
        raise SpaceExhausted(f"evolution: {self.max_retries} proposals in a row were taken by other processes")

    def tournament(self, members: list[Record]) -> Record:
        """The best of ``sample_size`` members (all, when fewer) drawn without replacement (first
        drawn wins ties)."""
        drawn = self.rng.choice(len(members), size=min(self.sample_size, len(members)), replace=False)
        return min((members[int(i)] for i in drawn), key=lambda r: r.value)

    def _mutate_new(self, members: list[Record], seen: set[str]) -> tuple[Architecture, str, dict] | None:
        """A new child of a tournament's winner: of ``candidates_now()`` mutations of one winner, the
        new one the surrogate ranks best (without one: one mutation); none new: another tournament."""
        for _ in range(self.max_retries):
            parent = self.space.decode(self.tournament(members).sample)
            children: dict[str, Architecture] = {}
            for _ in range(self.candidates_now()):
                child = self.space.mutate(parent, self.rng, num_mutations=self.num_mutations)
                if arch_hash(child) not in seen:
                    children.setdefault(arch_hash(child), child)
            if children:
                child = list(children.values())[self.pick(list(children.values()))]
                return child, arch_hash(child), self._encode(child, arch_hash(child))
        return None

    def _encode(self, child: Architecture, h: str) -> dict[str, Any]:
        # The history keeps flat samples, so the child must be one the space can decode again.
        sample = self.space.encode(child)
        if sample is None or arch_hash(self.space.decode(sample)) != h:
            raise ValueError(f"space.mutate gave architecture {h}, which space.encode cannot represent")
        return sample
