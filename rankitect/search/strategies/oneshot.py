"""The ``oneshot`` strategy: a weight-sharing supernet, evolution on inherited weights, retraining.

After NASRec (Zhang et al., WWW'23, arXiv 2207.07187):

1. **Supernet training** by uniform single-path sampling with a widest-path warm-up
   (:func:`~rankitect.supernet.oneshot_phase.train_supernet`), sized to the data like DNAS's.
2. **Regularized evolution** (:class:`~rankitect.search.strategies.evolution.RegularizedEvolution`)
   where each child is scored without training it
   (:func:`~rankitect.supernet.oneshot_phase.score`: weights cut from the supernet, the head
   fine-tuned on fixed training batches, NE on ``score_batches`` validation batches), with the FLOPs
   penalty, as the objective. The trained baselines the space holds are scored first and enter the
   population (:func:`seed_population`): the first tournaments mutate what engineers build, as in
   the sampling strategies, and the random initial population is that much smaller. They count
   towards the ``population + children`` scored paths.
3. **Retraining** of the best scored children from scratch (``run_trial``), ``supernet.top_k`` or
   ``search.trials`` of them where that is more, best first (where evolution scored fewer distinct
   children, mutations of the best trained architecture follow): they are the search's candidates,
   with test metrics, next to the baselines in the Pareto table.

The supernet's training curve is a ``supernet`` child run; every scored child a child run tagged
``rankitect.kind=scored`` holding its inherited validation NE.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from rankitect.config import OneShotConfig
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import SearchContext, SpaceExhausted, Strategy, register_strategy
from rankitect.search.proposing.plan_proposer import PlanProposer
from rankitect.search.strategies.evolution import RegularizedEvolution
from rankitect.space.architecture import Architecture
from rankitect.supernet.model import Supernet
from rankitect.supernet.oneshot_phase import ChildScorer, make_scorer, score, train_supernet
from rankitect.train.protocol import deadline_passed

SCORED = "scored"


def evolve(
    supernet: Supernet, scorer: ChildScorer, strategy: Strategy, evaluations: int, *,
    on_scored: Any = None, progress: bool = False, deadline: float | None = None,
) -> list[tuple[Architecture, TrialResult]]:
    """Ask/score/tell ``evaluations`` times (fewer past ``deadline``, a ``time.time()`` instant);
    ``on_scored(arch, result)`` sees every scored child."""
    scored = []
    for _ in tqdm(range(evaluations), desc="evolution", disable=not progress, dynamic_ncols=True):
        if deadline_passed(deadline):
            break
        try:
            arch = strategy.ask()
        except SpaceExhausted:
            break
        result = score(supernet, scorer, arch)
        strategy.tell(arch, result)
        scored.append((arch, result))
        if on_scored is not None:
            on_scored(arch, result)
    return scored


def seed_population(
    supernet: Supernet, scorer: ChildScorer, strategy: Strategy, archs: list[Architecture], *, on_scored: Any = None,
) -> list[tuple[Architecture, TrialResult]]:
    """Score ``archs`` (the trained baselines the space holds) on inherited weights and enter them
    into ``strategy``'s population (:meth:`~rankitect.search.base.Strategy.observe`): evolution then
    starts around what engineers build, as the sampling strategies do."""
    scored = []
    for arch in archs:
        result = score(supernet, scorer, arch)
        if strategy.observe(arch, result):
            scored.append((arch, result))
            if on_scored is not None:
                on_scored(arch, result)
    return scored


def best_scored(scored: list[tuple[Architecture, TrialResult]], objective: Objective, k: int) -> list[Architecture]:
    """The ``k`` distinct architectures with the lowest objective (first scored wins ties)."""
    ranked = sorted(range(len(scored)), key=lambda i: (objective(scored[i][1]), i))
    out: list[Architecture] = []
    for i in ranked:
        arch = scored[i][0]
        if all(arch.hash != a.hash for a in out):
            out.append(arch)
        if len(out) == k:
            break
    return out


@register_strategy("oneshot")
class OneShotSearch(PlanProposer):
    """``rankitect search --strategy oneshot``: supernet training and evolution on inherited weights
    (:meth:`search`), then the best children proposed to be retrained from scratch: ``supernet.top_k``, or
    ``search.trials`` where that is more (``fill``), best first.

    Takes the options of :class:`~rankitect.search.proposing.plan_proposer.PlanProposer`; ``config`` is the
    ``search.oneshot`` settings.
    """

    config_class = OneShotConfig

    def __init__(self, space: Any, *, seed: int, objective: Objective | None = None,
                 config: OneShotConfig | None = None, rocs: bool = False, fill: int = 0) -> None:
        super().__init__(space, seed=seed, objective=objective, config=config, rocs=rocs, fill=fill)
        self._climbing = False  # the last ask was a mutation (see prunable)

    @property
    def prunable(self) -> bool:  # type: ignore[override]
        """Whether the architecture last asked may be stopped early: a mutation, not a chosen child."""
        return self._climbing

    def start(self, context: SearchContext) -> None:
        super().start(context)
        self._done |= context.finished  # a resumed search proposes no finished candidate again

    def ask(self) -> Architecture:
        """The next planned child; once every one was asked (evolution on inherited weights scored
        fewer distinct children than ``fill``), a new mutation of the best architecture trained so
        far by objective (baselines included), so that ``search.trials`` candidates are trained."""
        try:
            arch = super().ask()
        except SpaceExhausted:
            if not self.fill:
                raise
            arch = self._mutation()
            self._climbing = True
        else:
            self._climbing = False
        return arch

    def _mutation(self, tries: int = 50) -> Architecture:
        seen = self._done | self._pending | self.trained
        for origin in self.ranked():
            for _ in range(tries):
                arch = self.space.mutate(origin, self.rng)
                if arch.hash not in seen:
                    self._pending.add(arch.hash)
                    self._echo(f"oneshot: retraining {arch.hash} from scratch (a mutation of {origin.hash})")
                    return arch
        raise SpaceExhausted("oneshot: no untried mutation of a trained architecture was found")

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        super().tell(arch, result)
        self.score(arch, result)

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Keep a trained baseline the space holds: evolution on inherited weights starts with it in
        its population (scored like any child), and it is never retrained."""
        super().observe(arch, result)
        return self.score(arch, result)

    def first_population(self) -> list[Architecture]:
        """The observed baselines, worst objective first (ties by hash), whatever order they finished
        in: the same search seeds the same population, and the best baseline is its youngest member,
        the last to age out."""
        return self.ranked(worst_first=True)

    def search(self, context: SearchContext) -> list[Architecture]:
        """Train the supernet, evolve on its weights; the ``supernet.top_k`` best children by objective."""
        cfg, seed, data, tracker = self.config, context.seed, context.data, context.tracker
        with self.supernet_phase(context) as (supernet, curves):
            train_supernet(supernet, data, context.train_cfg, cfg, seed=seed, curves=curves, progress=context.progress,
                           deadline=context.deadline, on_step=context.on_step, echo=context.echo)
        evolution = RegularizedEvolution(self.space, seed=seed, objective=self.objective,
                                         population=cfg.population, sample_size=cfg.sample_size)
        scorer = make_scorer(supernet, data, context.train_cfg, cfg)

        def log_scored(arch: Architecture, result: TrialResult) -> None:
            from rankitect.track.names import KIND

            tracker.log_trial(context.parent_run_id, arch, result, {KIND: SCORED})

        scored = seed_population(supernet, scorer, evolution, self.first_population(), on_scored=log_scored)
        if scored:
            context.echo(f"oneshot: {len(scored)} baseline(s) in the first population, scored on inherited weights")
        scored += evolve(supernet, scorer, evolution, cfg.population + cfg.children - len(scored),
                         on_scored=log_scored, progress=context.progress, deadline=context.deadline)
        return self.untrained(best_scored(scored, self.objective, self.plan_size + len(self.trained)), self.plan_size)


__all__ = ["OneShotSearch", "best_scored", "evolve", "seed_population"]
