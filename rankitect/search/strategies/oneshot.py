"""The ``oneshot`` strategy: a weight-sharing supernet, evolution on inherited weights, retraining.

After NASRec (Zhang et al., WWW'23, arXiv 2207.07187):

1. **Supernet training** by uniform single-path sampling: each step draws a path of the space
   uniformly; during warm-up the widest path is drawn instead with a probability falling linearly
   from 1 to 0 at ``warmup_steps``, so every weight gets trained early. Like DNAS's, the training
   is sized to the data (:func:`oneshot_schedule`): ``supernet_steps`` or ``epochs`` passes over
   the train split, whichever is fewer, the warm-up keeping its share of the steps.
2. **Regularized evolution** (:class:`~rankitect.search.strategies.evolution.RegularizedEvolution`) where each
   child is scored without training it: its weights are cut from the supernet, its head is
   fine-tuned for ``finetune_steps`` steps on the features of ``finetune_batches`` fixed training
   batches, and its NE on ``score_batches`` validation batches, with the FLOPs penalty, is the
   objective. The trained baselines the space holds are scored first and enter the population
   (:func:`seed_population`): the first tournaments mutate what engineers build, as in the
   sampling strategies, and the random initial population is that much smaller. They count
   towards the ``population + children`` scored paths.
3. **Retraining** of the best scored children from scratch (``run_trial``), ``top_k`` or
   ``search.trials`` of them where that is more, best first (where evolution scored fewer distinct
   children, mutations of the best trained architecture follow): they are the search's candidates,
   with test metrics, next to the baselines in the Pareto table.

The supernet's training curve is a ``supernet`` child run; every scored child a child run tagged
``rankitect.kind=scored`` holding its inherited validation NE.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from rankitect.config import OneShotConfig, TrainConfig
from rankitect.data.batch import Batch, concat_batches
from rankitect.errors import ConfigError
from rankitect.eval.metrics import MetricAccumulator
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import STOPPED_TAG, SearchContext, SpaceExhausted, Strategy, register_strategy
from rankitect.search.plan import PlanProposer
from rankitect.search.strategies.evolution import RegularizedEvolution
from rankitect.supernet.train import (
    CurveLogger, SupernetTrainer, batches, build_supernet, check_supernet_memory, save_supernet, set_bucket_edges,
    supernet_schedule,
)
from rankitect.space.architecture import Architecture
from rankitect.supernet.model import Supernet
from rankitect.train.protocol import BUDGET_STOP, deadline_passed

SCORED = "scored"


def check_oneshot_config(cfg: OneShotConfig) -> None:
    """Reject settings the loop cannot run with, naming the key."""
    for key in ("supernet_steps", "population", "sample_size", "score_batches", "top_k", "log_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"search.oneshot.{key} must be >= 1, got {getattr(cfg, key)!r}")
    for key in ("warmup_steps", "children", "finetune_batches", "finetune_steps"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"search.oneshot.{key} must be >= 0, got {getattr(cfg, key)!r}")
    if not cfg.epochs > 0:
        raise ConfigError(f"search.oneshot.epochs must be > 0, got {cfg.epochs!r}")
    if cfg.finetune_steps and not cfg.finetune_batches:
        raise ConfigError("search.oneshot.finetune_steps needs finetune_batches >= 1")
    if cfg.sample_size > cfg.population:
        raise ConfigError(f"search.oneshot.sample_size={cfg.sample_size} exceeds population={cfg.population}")


def oneshot_schedule(cfg: OneShotConfig, train_rows: int, batch_size: int) -> tuple[int, int]:
    """Supernet steps and warm-up steps (the widest path's probability reaching 0) on ``train_rows``
    training rows (:func:`~rankitect.supernet.train.supernet_schedule`).

    >>> oneshot_schedule(OneShotConfig(), 80_000, 512), oneshot_schedule(OneShotConfig(), 10**6, 512)
    ((157, 52), (600, 200))
    """
    return supernet_schedule(cfg.supernet_steps, cfg.warmup_steps, cfg.epochs, train_rows, batch_size)


def widest_probability(step: int, warmup_steps: int) -> float:
    """Probability of drawing the widest path at ``step``: 1 at step 0, falling linearly to 0.

    >>> [widest_probability(s, 4) for s in (0, 2, 4, 9)], widest_probability(0, 0)
    ([1.0, 0.5, 0.0, 0.0], 0.0)
    """
    return max(0.0, 1.0 - step / warmup_steps) if warmup_steps > 0 else 0.0


def train_supernet(
    supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: OneShotConfig, *, seed: int,
    curves: CurveLogger | None = None, progress: bool = False, deadline: float | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Train ``supernet`` for the steps of :func:`oneshot_schedule` on ``data``, one path a step;
    returns the losses. Past ``deadline`` (a ``time.time()`` instant: the search's time budget) it
    stops with the weights it has; ``on_step(step, steps)`` sees every step."""
    steps, warmup = oneshot_schedule(cfg, len(data.split("train")), train_cfg.batch_size)
    rng = np.random.default_rng(seed)
    trainer = SupernetTrainer(supernet, train_cfg, data.split("train").ctr)
    set_bucket_edges(supernet, data.split("train"), train_cfg.seed)
    stream = batches(data.split("train"), train_cfg.batch_size, train_cfg.seed)
    losses, taken = [], []
    bar = tqdm(range(steps), desc="supernet", disable=not progress, dynamic_ncols=True)
    for step in bar:
        p_widest = widest_probability(step, warmup)
        path = supernet.widest_path(rng) if rng.random() < p_widest else supernet.space.sample(rng)
        skipped = trainer.skipped
        losses.append(trainer.step(next(stream), path))
        taken.append(trainer.skipped == skipped)
        if step % cfg.log_every == 0 or step == steps - 1:
            window = [loss for loss, ok in zip(losses[-cfg.log_every:], taken[-cfg.log_every:]) if ok]
            row = {"train/loss": float(np.mean(window)) if window else math.nan,
                   "train/skipped": 1.0 - float(np.mean(taken[-cfg.log_every:])), "train/p_widest": p_widest}
            bar.set_postfix(loss=f"{row['train/loss']:.4f}", skipped=trainer.skipped)
            if curves is not None:
                curves.log(step, row)
        if on_step is not None:
            on_step(step + 1, steps)
        if deadline_passed(deadline):
            break
    return losses


class ChildScorer:
    """Scores paths with inherited weights: head fine-tuned on fixed features, NE on fixed batches.

    The frozen body runs once per child on all fine-tune rows and once on all validation rows (each
    set as one batch: a path's weights are cut twice, not once per batch); the head's steps then
    take the fine-tune batches' features one batch at a time.

    Args:
        supernet: the trained supernet (left unchanged).
        finetune: training batches whose features the head is fine-tuned on (the same for every child).
        val: validation batches the child is scored on (the same for every child).
        lr: Adam's learning rate for the head.
        steps: head steps, one batch's features each, cycling over ``finetune``.
    """

    def __init__(self, supernet: Supernet, finetune: list[Batch], val: list[Batch], lr: float, steps: int) -> None:
        self.supernet, self.lr, self.steps = supernet, lr, steps
        self.finetune = concat_batches(finetune) if finetune else None
        self.sizes = [len(b) for b in finetune]
        self.labels = [b.labels for b in finetune]
        self.val = concat_batches(val)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def __call__(self, path: dict[str, Any]) -> dict[str, float]:
        """Validation metrics (NE, logloss, AUC, calibration) of ``path`` after the head's fine-tune."""
        was_training = self.supernet.training
        self.supernet.eval()
        try:
            head = self.supernet.plan(path).head
            params = {k: v.detach().clone().requires_grad_() for k, v in self.supernet.head_params(path).items()}
            if self.finetune is not None and self.steps:
                opt = torch.optim.Adam(params.values(), lr=self.lr)
                with torch.no_grad():  # the body is frozen: its features once
                    feats = torch.split(self.supernet.features(self.finetune, path), self.sizes)
                for step in range(self.steps):
                    i = step % len(feats)
                    opt.zero_grad(set_to_none=True)
                    self.loss_fn(functional_call(head, params, (feats[i],)), self.labels[i]).backward()
                    opt.step()
            acc = MetricAccumulator()
            with torch.no_grad():
                acc.update(functional_call(head, params, (self.supernet.features(self.val, path),)), self.val.labels)
        finally:
            self.supernet.train(was_training)
        return {k: float(v) for k, v in acc.compute().items()}


def make_scorer(supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: OneShotConfig) -> ChildScorer:
    """A scorer on ``finetune_batches`` shuffled training batches and the first ``score_batches`` validation ones."""
    stream = batches(data.split("train"), train_cfg.batch_size, train_cfg.seed + 7)
    finetune = [next(stream) for _ in range(cfg.finetune_batches)]
    val_it = data.split("val").batches(train_cfg.batch_size, shuffle=False)
    val = [b for _, b in zip(range(cfg.score_batches), val_it)]
    return ChildScorer(supernet, finetune, val, train_cfg.lr_dense, cfg.finetune_steps)


def score(supernet: Supernet, scorer: ChildScorer, arch: Architecture) -> TrialResult:
    """``arch`` scored on inherited weights (:class:`ChildScorer`); a non-finite NE is a failure."""
    path = supernet.as_path(arch)
    metrics, mflops = scorer(path), supernet.path_flops(path) / 1e6
    return (TrialResult(val_ne=metrics["ne"], mflops=mflops) if math.isfinite(metrics["ne"])
            else TrialResult.failure(f"inherited NE is {metrics['ne']}", mflops=mflops))


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
    (:meth:`search`), then the best children proposed to be retrained from scratch: ``top_k``, or
    ``search.trials`` where that is more (``fill``), best first.

    Takes the options of :class:`~rankitect.search.plan.PlanProposer`; ``config`` is the
    ``search.oneshot`` settings.
    """

    config_class = OneShotConfig
    check_config = staticmethod(check_oneshot_config)

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
        """Train the supernet, evolve on its weights; the ``top_k`` best children by objective."""
        cfg, seed, data, tracker = self.config, context.seed, context.data, context.tracker
        memory = check_supernet_memory(self.space, data.spec, context.memory_budget, context.flops_range)
        context.echo(f"oneshot: supernet estimated at {memory.describe()}")
        supernet = build_supernet(self.space, data.spec, seed)
        steps, warmup = oneshot_schedule(cfg, len(data.split("train")), context.train_cfg.batch_size)
        context.echo(f"oneshot: supernet of {sum(p.numel() for p in supernet.parameters()):,} parameters, "
                     f"{steps} steps (widest-path warm-up over {warmup})")
        run_id = tracker.start_child_run(context.parent_run_id, "supernet", "supernet")
        curves = CurveLogger(tracker, run_id)
        losses = train_supernet(supernet, data, context.train_cfg, cfg, seed=seed, curves=curves,
                                progress=context.progress, deadline=context.deadline, on_step=context.on_step)
        curves.flush()
        if deadline_passed(context.deadline):
            context.echo(f"oneshot: supernet stopped by the time budget after {len(losses)} of {steps} steps")
            tracker.set_tag(run_id, STOPPED_TAG, BUDGET_STOP)
        save_supernet(tracker, run_id, supernet, self.space, data.spec)
        tracker.end_run(run_id, "FINISHED")
        evolution = RegularizedEvolution(self.space, seed=seed, objective=self.objective,
                                         population=cfg.population, sample_size=cfg.sample_size)
        scorer = make_scorer(supernet, data, context.train_cfg, cfg)

        def log_scored(arch: Architecture, result: TrialResult) -> None:
            from rankitect.track.mlflow_tracker import KIND

            tracker.log_trial(context.parent_run_id, arch, result, {KIND: SCORED})

        scored = seed_population(supernet, scorer, evolution, self.first_population(), on_scored=log_scored)
        if scored:
            context.echo(f"oneshot: {len(scored)} baseline(s) in the first population, scored on inherited weights")
        scored += evolve(supernet, scorer, evolution, cfg.population + cfg.children - len(scored),
                         on_scored=log_scored, progress=context.progress, deadline=context.deadline)
        return self.untrained(best_scored(scored, self.objective, self.plan_size + len(self.trained)), self.plan_size)


__all__ = ["ChildScorer", "OneShotSearch", "best_scored", "check_oneshot_config", "evolve", "make_scorer",
           "oneshot_schedule", "score", "seed_population", "train_supernet", "widest_probability"]
