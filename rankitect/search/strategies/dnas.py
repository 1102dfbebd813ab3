"""The ``dnas`` strategy: differentiable search over every choice of a preset space.

Architecture weights (:class:`~rankitect.supernet.dnas_weights.ArchitectureWeights`, one logit per
option of every label: ops, widths, inputs ...) and the supernet's weights are trained together,
each weight step on one path drawn from the current distribution (no dense work for unsampled
options). The architecture weights minimize the expected

    objective.torch_value(NE of the batch, MFLOPs)

(NE times the ``relaxed`` or ``absolute`` cost per doubling of FLOPs beyond ``search.target_mflops``,
:mod:`rankitect.eval.objective`), by one of two estimators (``search.dnas.estimator``):

* ``reinforce`` (the default): the score function with a leave-one-out baseline. ``samples``
  paths are drawn from the distribution and scored on one batch with the weights as they are
  (forward only); each path's log-probability moves by how much better its objective is than the
  others' on the same batch (:meth:`ArchStep.reinforce`). Every option competes on its measured
  score, empty ones (no layer, no cross network) included, the batch's difficulty cancels out of
  each comparison, and a path's FLOPs enter exactly. The weights then step on the first path.
* ``gumbel``: hard Gumbel-softmax samples with a straight-through gradient (GDAS), the
  temperature annealed from ``tau_start`` to ``tau_end``. The gradient a gate gets is that of
  scaling its option's output, which is near zero for any option the weights have adapted to,
  and an empty option's gate scales nothing, so it gets no signal of its own: its most probable
  path can drift to the cheapest one even with NE alone as the objective. With ``arch_split: train`` one forward
  and one backward step both; with ``val`` the architecture steps on validation batches.

``arch_split: train`` scores paths on training batches the weights have not yet seen in this pass
(the schedule is at most ``epochs`` passes); ``val`` on validation batches. The penalty's gradient
of the ``gumbel`` estimator comes from the expected FLOPs, differentiable in the choice
probabilities (:meth:`ArchStep.objective_of`). The search is sized to the data
(:func:`dnas_schedule`): at most ``epochs`` passes over the train split (``auto``, the default: as
many as the baselines took to their best validation, :func:`auto_epochs`), and it stops once the most
probable architecture has held for ``stable_steps`` architecture steps. It starts around the best
trained baseline the space holds (``start_logit`` more per choice), as the sampling strategies start
from the baselines. The most probable architecture (and the next ``top_k - 1``) is then retrained
from scratch and scored on the test split; then the retraining goes on, around the best
architecture retrained so far, the changes the architecture weights prefer first
(:class:`DnasSearch`), until ``search.trials`` are trained (or a time budget is spent). The entropy of
every choice, the expected MFLOPs and the temperature are logged to a ``supernet`` child run in
batches.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tqdm import tqdm

from rankitect.config import DnasConfig, SurrogateConfig, TrainConfig
from rankitect.data.batch import Batch
from rankitect.errors import ConfigError
from rankitect.eval.objective import Objective, at_most
from rankitect.eval.result import TrialResult
from rankitect.search.base import STOPPED_TAG, SearchContext, Space, SpaceExhausted, register_strategy
from rankitect.search.plan import PlanProposer
from rankitect.search.surrogate import Guide, Guided
from rankitect.supernet.dnas_weights import ArchitectureWeights, ExpectedFlops, tau_at
from rankitect.supernet.train import (
    CurveLogger, SupernetTrainer, batches, build_supernet, check_supernet_memory, frozen, save_supernet,
    set_bucket_edges, supernet_schedule,
)
from rankitect.space.architecture import Architecture
from rankitect.supernet.model import Supernet
from rankitect.supernet.ranking import RankCheck, probe_check
from rankitect.train.protocol import BUDGET_STOP, deadline_passed


def check_dnas_config(cfg: DnasConfig) -> None:
    """Reject settings the loop cannot run with, naming the key."""
    for key in ("supernet_steps", "arch_every", "top_k", "log_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"search.dnas.{key} must be >= 1, got {getattr(cfg, key)!r}")
    if not (cfg.epochs == "auto" or cfg.epochs > 0) or cfg.stable_steps < 0:
        raise ConfigError(f"search.dnas.epochs must be > 0 and stable_steps >= 0, got {cfg.epochs!r}, "
                          f"{cfg.stable_steps!r}")
    if cfg.estimator not in ("reinforce", "gumbel"):
        raise ConfigError(f"search.dnas.estimator must be 'reinforce' or 'gumbel', got {cfg.estimator!r}")
    if cfg.estimator == "reinforce" and cfg.samples < 2:
        raise ConfigError(f"search.dnas.samples must be >= 2 (each path is scored against the others), got "
                          f"{cfg.samples!r}")
    if cfg.warmup_steps < 0 or cfg.arch_lr <= 0:
        raise ConfigError(f"search.dnas.warmup_steps must be >= 0 and arch_lr > 0, got {cfg.warmup_steps!r}, "
                         f"{cfg.arch_lr!r}")
    tau_at(0, 1, cfg.tau_start, cfg.tau_end)  # raises on a non-positive temperature


def dnas_schedule(cfg: DnasConfig, train_rows: int, batch_size: int) -> tuple[int, int]:
    """Weight steps and warmup steps of a search on ``train_rows`` training rows: ``supernet_steps``
    or ``epochs`` passes over the train split, whichever is fewer, the warmup keeping its share
    (:func:`~rankitect.supernet.train.supernet_schedule`, as one-shot's); the temperature anneals
    over the steps run. ``epochs: auto`` not yet resolved (:func:`auto_epochs`) is one pass.

    >>> dnas_schedule(DnasConfig(epochs=1.0), 80_000, 512), dnas_schedule(DnasConfig(epochs=1.0), 10**6, 512)
    ((157, 26), (300, 50))
    """
    epochs = 1.0 if cfg.epochs == "auto" else cfg.epochs
    return supernet_schedule(cfg.supernet_steps, cfg.warmup_steps, epochs, train_rows, batch_size)


def auto_epochs(best_steps: list[int], train_rows: int, batch_size: int) -> float:
    """``search.dnas.epochs: auto``: the median over the trained baselines of the epochs they took to
    their best validation, at least 1 (1 without any). On data where models improve for many
    epochs a supernet that sees each row once has learnt too little to rank paths by; on data whose
    models peak in their first epoch, one pass is what they need too.

    >>> auto_epochs([3 * 157, 9 * 157, 5 * 157], 80_000, 512), auto_epochs([100], 80_000, 512), auto_epochs([], 10, 5)
    (5.0, 1.0, 1.0)
    """
    if not best_steps:
        return 1.0
    return max(1.0, statistics.median(best_steps) / math.ceil(train_rows / batch_size))


@dataclass
class ArchStep:
    """One step of the architecture weights: the optimizer and what the loss needs."""

    supernet: Supernet
    weights: ArchitectureWeights
    optimizer: torch.optim.Optimizer
    trainer: SupernetTrainer
    expected: ExpectedFlops
    objective: Objective
    refresh_every: int = 3  # architecture steps between moves of the penalty's expansion point
    last_paths: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    _point: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _age: int = field(default=0, init=False, repr=False)

    def expansion_point(self) -> dict[str, Any]:
        """The most probable path, re-read every ``refresh_every`` calls: early on the logits are
        near ties and the argmax flips every step, and each new point costs every option of every
        active label; a point two steps old serves a first-order penalty gradient as well."""
        if self._point is None or self._age >= self.refresh_every:
            self._point, self._age = self.weights.argmax(), 0
        self._age += 1
        return self._point

    def _gated(self, generator: torch.Generator, tau: float) -> tuple[dict[str, Any], dict[str, torch.Tensor], float]:
        """A hard Gumbel-softmax path, its gates (straight-through, forward value 1) and its MFLOPs."""
        path, relaxed = self.weights.gumbel(generator, tau)
        gates = {label: w[self.supernet.space.choices[label].index(path[label])] for label, w in relaxed.items()}
        return path, gates, self.supernet.path_flops(path) / 1e6

    def __call__(self, batch: Batch, generator: torch.Generator, tau: float) -> dict[str, float]:
        """An architecture step on its own forward (``arch_split: val``): the weights stay frozen."""
        path, gates, sampled = self._gated(generator, tau)
        ne = self.trainer.ne(self.supernet(batch, path, gates, take=frozen), batch.labels)
        value = self.objective_of(ne, sampled)
        params = self.weights.arch_parameters()
        # Only the architecture weights learn here: the supernet's weights never see validation data.
        grads = torch.autograd.grad(value, params, allow_unused=True)
        for p, g in zip(params, grads):
            p.grad = g
        self._update()
        return {"arch/ne": float(ne.detach()), "arch/objective": float(value.detach()),
                "arch/sample_mflops": sampled}

    def joint(self, batch: Batch, generator: torch.Generator, tau: float) -> dict[str, float]:
        """Weights and architecture on one forward and one backward (``arch_split: train``, one-level
        DARTS): the path is the architecture's Gumbel sample, the weights step on its loss and the
        architecture weights on its objective; an exploding path steps neither."""
        path, gates, sampled = self._gated(generator, tau)
        seen: dict[str, float] = {}

        def objective(loss: torch.Tensor) -> torch.Tensor:
            ne = loss / self.trainer.base_entropy
            value = self.objective_of(ne, sampled)
            seen.update({"arch/ne": float(ne.detach()), "arch/objective": float(value.detach())})
            return value

        for p in self.weights.arch_parameters():
            p.grad = None
        skipped = self.trainer.skipped
        loss = self.trainer.step(batch, path, gates=gates, objective=objective)
        if self.trainer.skipped == skipped:
            self._update()
        return {"train/loss": loss, **seen, "arch/sample_mflops": sampled}

    def reinforce(self, batch: Batch, generator: torch.Generator, samples: int, *,
                  train: bool = False) -> dict[str, float]:
        """An architecture step by the score function (REINFORCE, leave-one-out baseline): ``samples``
        paths drawn from the current distribution are scored on one batch with the weights as they
        are (forward only); each path's log-probability is pushed by how much better its objective
        is than the mean of the others on the same batch. Every option of every label competes on
        its score, empty options (no layer, no cross) included, and the batch's difficulty cancels
        out of each comparison. With ``train`` the weights then step on the first path and the
        batch, and that step's forward (taken before the update) is the first path's score: one
        forward fewer. Returns the first path's metrics.
        """
        paths = [self.weights.sample(generator) for _ in range(samples)]
        nes: list[float] = [math.nan] * samples
        with torch.no_grad():
            for i, path in enumerate(paths):
                if i or not train:  # the first path's score comes from its training step below
                    nes[i] = float(self.trainer.ne(self.supernet(batch, path, take=frozen), batch.labels))
        row = {}
        if train:  # after the others are scored: every score is taken with the same weights
            row["train/loss"] = self.trainer.step(batch, paths[0])
            nes[0] = row["train/loss"] / self.trainer.base_entropy
        nes = [ne if math.isfinite(ne) else self.trainer.max_ne for ne in nes]
        flops = [self.supernet.path_flops(path) / 1e6 for path in paths]
        values = [float(self.objective.torch_value(torch.tensor(min(ne, self.trainer.max_ne)), torch.tensor(f)))
                  for ne, f in zip(nes, flops)]
        total = sum(values)
        surrogate = torch.zeros(())
        for path, value in zip(paths, values):
            advantage = value - (total - value) / (samples - 1)
            surrogate = surrogate + advantage * self.weights.log_prob(path)
        params = self.weights.arch_parameters()
        grads = torch.autograd.grad(surrogate / samples, params, allow_unused=True)
        for p, g in zip(params, grads):
            p.grad = g
        self._update()
        self.last_paths = paths
        return {**row, "arch/ne": nes[0], "arch/objective": values[0], "arch/sample_mflops": flops[0],
                "arch/spread": max(values) - min(values)}

    def _update(self) -> None:
        """Step the architecture weights on the gradients they hold (none: zero)."""
        params = self.weights.arch_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # An exploding path's NE would otherwise flood Adam's second moments for every later step.
        torch.nn.utils.clip_grad_norm_(params, self.trainer.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def expected_mflops(self) -> float:
        """Expected MFLOPs of the current distribution (for the curves: costed when logged)."""
        return float(self.expected(self.weights.probs())) / 1e6

    def objective_of(self, ne: torch.Tensor, sampled_mflops: float) -> torch.Tensor:
        """NE plus the FLOPs penalty of the sampled path, with the penalty's gradient in every probability.

        The value is the sample's ``objective.torch_value(ne, C(x))``. The penalty's gradient comes
        from the expected FLOPs ``sum_i p_i C_i`` of :class:`ExpectedFlops`, put through the penalty
        option by option around the most probable path ``m``: in ``p_{l,i}`` it is
        ``objective.torch_value(ne, C(m with label l at option i))``, what that option would make of
        the current architecture's objective. Probability flows to the options that bring it to the
        target; the cost tables change only when ``m`` does (:meth:`expansion_point`).
        """
        value = self.objective.torch_value(ne, torch.tensor(sampled_mflops, dtype=ne.dtype))
        base, costs = self.expected.table(self.expansion_point())
        probs = self.weights.probs()
        here = self.objective.torch_value(ne.detach(), torch.tensor(base / 1e6, dtype=ne.dtype))
        pull = torch.zeros((), dtype=ne.dtype)
        for label, c in costs.items():
            options = self.objective.torch_value(ne.detach(), (c / 1e6).to(ne.dtype))  # (n_options,)
            pull = pull + (probs[label] * (options - here)).sum()
        return value + (pull - pull.detach())  # the sample's objective, with the penalty's gradient


def dnas_search(
    supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: DnasConfig, objective: Objective, *, seed: int,
    curves: CurveLogger | None = None, progress: bool = False, echo: Callable[[str], None] | None = None,
    start: dict[str, Any] | None = None, rank_check: RankCheck | None = None, deadline: float | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> ArchitectureWeights:
    """Train ``supernet`` and architecture weights over its space; returns the architecture weights.

    ``data`` has ``split("train")`` and ``split("val")`` (a :class:`~rankitect.data.ClickData`);
    ``seed`` drives the Gumbel noise (the batches follow ``train_cfg.seed``). The loop runs the steps
    of :func:`dnas_schedule` and stops early once the most probable architecture has not changed for
    ``stable_steps`` architecture steps. With ``start`` (a path, e.g. the best baseline's) the
    architecture weights start ``cfg.start_logit`` towards it: the search explores around it, and
    holding the start never stops it early (:class:`Stability`). With ``rank_check`` the supernet's
    order of its probe paths is read every ``cfg.rank_every`` steps after the warmup (logged as
    ``rank/*``); with ``cfg.stop == "ranking"`` the loop stops once that order holds instead. Past
    ``deadline`` (a ``time.time()`` instant: the search's time budget) the loop stops with the
    weights it has; ``on_step(step, steps)`` sees every step.
    """
    check_dnas_config(cfg)
    steps, warmup = dnas_schedule(cfg, len(data.split("train")), train_cfg.batch_size)
    generator = torch.Generator().manual_seed(seed)
    weights = ArchitectureWeights(supernet.space)
    if start is not None:
        weights.lean_towards(start, cfg.start_logit)
    trainer = SupernetTrainer(supernet, train_cfg, data.split("train").ctr)
    set_bucket_edges(supernet, data.split("train"), train_cfg.seed)
    arch_step = ArchStep(supernet, weights, torch.optim.Adam(weights.arch_parameters(), lr=cfg.arch_lr), trainer,
                         ExpectedFlops(supernet), objective)
    train_it = batches(data.split("train"), train_cfg.batch_size, train_cfg.seed)
    val_it: Iterator[Batch] = batches(data.split("val"), train_cfg.batch_size, train_cfg.seed + 1)
    stable = Stability(supernet.space, cfg.stable_steps, start)
    bar = tqdm(range(steps), desc="dnas", disable=not progress, dynamic_ncols=True)
    for step in bar:
        tau = tau_at(step, steps, cfg.tau_start, cfg.tau_end)
        arch_now = step >= warmup and (step - warmup) % cfg.arch_every == 0
        reinforce = cfg.estimator == "reinforce"
        if arch_now and cfg.arch_split == "train":  # one pass over the batch steps weights and architecture
            row = (arch_step.reinforce(next(train_it), generator, cfg.samples, train=True) if reinforce
                   else arch_step.joint(next(train_it), generator, tau))
        else:
            row = {"train/loss": trainer.step(next(train_it), weights.sample(generator))}
            if arch_now:
                row.update(arch_step.reinforce(next(val_it), generator, cfg.samples) if reinforce
                           else arch_step(next(val_it), generator, tau))
        row["train/skipped"] = float(trainer.skipped)
        done = arch_now and stable.update(weights.argmax()) and cfg.stop == "argmax"
        if rank_check is not None and step >= warmup and (step + 1 - warmup) % cfg.rank_every == 0:
            reading = rank_check.read()  # stop: ranking, once the supernet's order of the probes holds
            row.update({"rank/tau_previous": reading.tau_previous, "rank/tau_baselines": reading.tau_truth})
            done = done or (cfg.stop == "ranking" and rank_check.stable)
        if curves is not None and (step % cfg.log_every == 0 or step == steps - 1 or done):
            entropy = {f"entropy/{label}": h for label, h in weights.entropy().items()}
            curves.log(step, {**row, **entropy, "arch/tau": tau, "arch/expected_mflops": arch_step.expected_mflops(),
                              "arch/stable_steps": float(stable.held)})
        if "arch/ne" in row:
            bar.set_postfix(ne=f"{row['arch/ne']:.4f}")
        if on_step is not None:
            on_step(step + 1, steps)
        if done:
            if echo is not None:
                why = (f"the most probable architecture held {stable.held} architecture steps" if cfg.stop == "argmax"
                       else f"its order of {len(rank_check.probes)} probe paths held {rank_check.held} readings")
                echo(f"dnas: {why}; stopped after {step + 1} of {steps} steps")
            break
        if deadline_passed(deadline) and step + 1 < steps:
            if echo is not None:
                echo(f"dnas: stopped by the time budget after {step + 1} of {steps} steps")
            break
    bar.close()
    return weights


class Stability:
    """Counts architecture steps over which the most probable architecture stayed the same.

    A search that starts around a path (the best baseline, ``start_logit`` more per choice) holds
    that path as its most probable until the scores outweigh the lean, which on small data can take
    longer than ``stable_steps``. Holding
    the start says nothing yet about the data, so it never ends the search: the count may end it
    only once the most probable architecture has left the start (and then any path, the start
    again included, holding ``patience`` steps does). A start that is never left runs the
    schedule, which ``epochs`` and ``supernet_steps`` bound.

    Args:
        space: decodes paths (paths that differ only in labels the architecture does not read are one).
        patience: the count at which :meth:`update` says stop (0: never).
        start: the path the search leans towards (None: no lean, every hold counts).
    """

    def __init__(self, space: Any, patience: int, start: dict[str, Any] | None = None) -> None:
        self.space, self.patience = space, patience
        self.held, self._last = 0, None
        self._start = None if start is None else space.decode(start).hash
        self.left_start = start is None

    def update(self, path: dict[str, Any]) -> bool:
        """Record the most probable path after an architecture step; whether it held long enough."""
        now = self.space.decode(path).hash
        self.left_start = self.left_start or now != self._start
        self.held = self.held + 1 if now == self._last else 0
        self._last = now
        return self.patience > 0 and self.left_start and self.held >= self.patience


@register_strategy("dnas")
class DnasSearch(Guided, PlanProposer):
    """``rankitect search --strategy dnas``: :func:`dnas_search` (:meth:`search`), then the ``top_k``
    most probable architectures proposed to be retrained from scratch.

    Where ``fill`` (``search.trials``) is more than ``top_k`` the retraining goes on once those are done, and
    learns from what it retrains: each further ask is the next untried one-choice change of the best
    architecture trained so far by objective (baselines included), the change the architecture
    weights prefer most first (:meth:`~rankitect.supernet.dnas_weights.ArchitectureWeights.neighbours`).
    A change that beats its origin becomes the next origin; an origin whose changes are all tried
    gives way to the next best architecture. Every other change is a simplification: it costs less
    than its origin and no more than the FLOPs target where there is one (:meth:`_climb`), so the
    search also looks for a better model at the target's cost, and for a cheaper one as good as
    the best. Changes may be pruned (``search.pruning``) as evolution's children are; what the supernet
    chose is trained in full. So the supernet orders the moves, and retraining, not the supernet's
    shared weights, decides where the search moves: on small data the shared weights favour small
    paths, and retraining the most probable paths alone, one after another, learns nothing from any
    of them.

    With a surrogate (``search.surrogate``, :mod:`rankitect.search.surrogate`) the change trained is
    the best-ranked of the origin's first ``candidates`` untried ones (in the weights' order), by a
    surrogate fitted on every trained model, baselines and pruned changes included.

    Takes the options of :class:`~rankitect.search.plan.PlanProposer`; ``config`` is the
    ``search.dnas`` settings.
    """

    config_class = DnasConfig
    check_config = staticmethod(check_dnas_config)

    def __init__(self, space: Space, *, seed: int, objective: Objective | None = None,
                 config: DnasConfig | None = None, rocs: bool = False, fill: int = 0,
                 surrogate: SurrogateConfig | None = None) -> None:
        super().__init__(space, seed=seed, objective=objective, config=config, rocs=rocs, fill=fill)
        self.guide = Guide.from_config(space, seed, surrogate)  # ranks the climb's changes
        self._best_steps: list[int] = []  # of every trained baseline, for epochs: auto
        self.weights: ArchitectureWeights | None = None  # once searched (or resumed)
        self._climbing = False  # the last ask was a change (see prunable)
        self._climbs = 0  # changes asked: with a FLOPs target, the two kinds take turns (see _climb)
        self._data: Any = None  # the search's data, for the MFLOPs of a change (set by start)
        self._mflops: dict[str, float] = {}  # of changes considered, by genotype hash
        self._known: list[tuple[Architecture, float]] = []  # trained baselines and their val NE

    @property
    def prunable(self) -> bool:  # type: ignore[override]
        """Whether the architecture last asked may be stopped early: a change, not a chosen one."""
        return self._climbing

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Keep a trained baseline the space holds: the search starts around the best one (and
        never retrains it). Every trained baseline tells ``epochs: auto`` how long models take here."""
        super().observe(arch, result)
        self.learn(arch, result)
        if result.ok:
            self._known.append((arch, result.val_ne))  # the probes the supernet's ranking is checked on
        if result.ok and result.best_step:
            self._best_steps.append(result.best_step)
        return self.score(arch, result)

    def search(self, context: SearchContext) -> list[Architecture]:
        """Train the supernet and its architecture weights; the ``top_k`` most probable paths."""
        cfg, data, tracker = self.config, context.data, context.tracker
        memory = check_supernet_memory(self.space, data.spec, context.memory_budget, context.flops_range)
        context.echo(f"dnas: supernet estimated at {memory.describe()}")
        supernet = build_supernet(self.space, data.spec, context.seed)
        run_id = tracker.start_child_run(context.parent_run_id, "supernet", "supernet")
        curves = CurveLogger(tracker, run_id)
        rows, batch_size = len(data.split("train")), context.train_cfg.batch_size
        if cfg.epochs == "auto":
            cfg = replace(cfg, epochs=auto_epochs(self._best_steps, rows, batch_size))
            context.echo(f"dnas: epochs auto: {cfg.epochs:.1f} (the baselines' median epochs to their best validation)")
        steps, warmup = dnas_schedule(cfg, rows, batch_size)
        context.echo(f"dnas: supernet of {sum(p.numel() for p in supernet.parameters()):,} parameters, "
                     f"at most {steps} steps (architecture steps from step {warmup})")
        ranked = self.ranked()
        start = self.space.encode(ranked[0]) if ranked else None
        check = probe_check(supernet, self._known, ranked[0] if ranked else None, data.split("val"),
                            batch_size=context.train_cfg.batch_size, seed=context.seed)
        self.weights = dnas_search(supernet, data, context.train_cfg, cfg, self.objective, seed=context.seed,
                                   curves=curves, progress=context.progress, echo=context.echo, start=start,
                                   rank_check=check if cfg.stop == "ranking" else None,
                                   deadline=context.deadline, on_step=context.on_step)
        curves.flush()
        if deadline_passed(context.deadline):
            tracker.set_tag(run_id, STOPPED_TAG, BUDGET_STOP)
        save_supernet(tracker, run_id, supernet, self.space, data.spec)
        tracker.log_dict(run_id, self.weights.to_dict(), "architecture_probs.json")
        tracker.end_run(run_id, "FINISHED")
        paths = self.weights.most_probable(cfg.top_k + len(self.trained))
        flops = {self.space.decode(p).hash: supernet.path_flops(p) / 1e6 for p in paths}
        archs = self.untrained([self.space.decode(p) for p in paths], cfg.top_k)
        if check is not None and not self._ranks(check, context.echo) and self.fill > cfg.top_k and self.scored:
            archs = []  # what it chose is not worth training first: the climb around the best baseline starts
        for arch in archs:
            context.echo(f"dnas: derived {arch.hash} ({flops[arch.hash]:.3f} MFLOPs)")
        if self.fill > len(archs):
            context.echo(f"dnas: then, until {self.fill} are trained (or a time budget is spent), one-choice changes "
                         "of the best architecture trained so far, the most probable first")
        return archs

    def _ranks(self, check: RankCheck, echo: Callable[[str], None]) -> bool:
        """Whether the supernet ranks the trained baselines it holds at ``rank_tau`` or better (said
        either way); with fewer than three there is nothing to judge by, and it is trusted. Scores
        all tied (tau ``nan``) rank nothing."""
        tau = check.read().tau_truth
        if check.known < 3:
            return True
        ranks = tau >= self.config.rank_tau  # False for nan
        echo(f"dnas: the supernet ranks the {check.known} trained baselines it holds at Kendall tau {tau:.2f}"
             + ("" if ranks else f", below search.dnas.rank_tau {self.config.rank_tau:g}: it cannot rank here, so "
                + ("retraining starts at once from changes of the best trained architecture"
                   if self.fill > self.config.top_k else "what it chose is retrained, but trust it less")))
        return ranks

    def start(self, context: SearchContext) -> None:
        super().start(context)
        self._done |= context.finished  # a resumed search proposes no finished candidate again
        self._data = context.data
        if self.guide is not None:
            self.guide.price = self.mflops

    def ask(self) -> Architecture:
        try:
            arch = super().ask()
        except SpaceExhausted:
            if self.fill <= self.config.top_k or self.weights is None:
                raise
            arch = self._climb(self.weights)
            self._climbing = True
        else:
            self._climbing = False
        return arch

    def _climb(self, weights: ArchitectureWeights) -> Architecture:
        """The next untried one-choice change of the best trained architecture that has one left.

        Two kinds of change take turns: any change (the penalty weighs what it costs), and a
        simplification, a change that costs less than its origin and no more than the FLOPs target
        (``search.target_mflops``, where there is one), of the best architecture that has one left.
        The objective trades NE for FLOPs and its best often lies above the target: the second kind
        keeps looking for a better model at the target's cost, which is what ``target_mflops: auto``
        asks for. Below the target it looks for a cheaper model as good as the best, which is what
        the winner's rule returns (the cheapest candidate within the noise of the best,
        :mod:`rankitect.search.selection`); the first kind grows a model as readily as it shrinks
        it. A kind with nothing left gives its turn to the other.
        """
        seen = self._done | self._pending | self.trained
        simplify_first = self._climbs % 2 == 1
        for cheaper in (simplify_first, not simplify_first):
            found = self._change(weights, seen, cheaper)
            if found is not None:
                origin, arch = found
                self._climbs += 1
                self._pending.add(arch.hash)
                target = self.objective.target_mflops
                within = ("" if not cheaper else ", cheaper" if target is None
                          else f", cheaper, at no more than {target:.4g} MFLOPs")
                self._echo(f"dnas: retraining {arch.hash} from scratch (a change of {origin.hash}{within})")
                return arch
        raise SpaceExhausted("dnas: every one-choice change of every trained architecture was proposed")

    def _change(self, weights: ArchitectureWeights, seen: set[str],
                cheaper: bool) -> tuple[Architecture, Architecture] | None:
        """``(origin, change)``: the most preferred change not in ``seen`` of the best trained
        architecture with one left; where ``cheaper``, a simplification (:meth:`_simpler`)."""
        for origin in self.ranked():
            changes: dict[str, Architecture] = {}  # the first candidates_now() untried, the surrogate picks
            for move in weights.neighbours(self.space.encode(origin)):
                try:
                    arch = self.space.decode(move)
                except ValueError:
                    continue
                if arch.hash not in seen and (not cheaper or self._simpler(arch, origin)):
                    changes.setdefault(arch.hash, arch)
                    if len(changes) >= self.candidates_now():
                        break
            if changes:
                return origin, list(changes.values())[self.pick(list(changes.values()))]
        return None

    def _simpler(self, arch: Architecture, origin: Architecture) -> bool:
        """Whether ``arch`` costs less than ``origin`` and no more than the FLOPs target (if any)."""
        target, mflops = self.objective.target_mflops, self.mflops(arch)
        return mflops < self.mflops(origin) and (target is None or at_most(mflops, target))

    def mflops(self, arch: Architecture) -> float:
        """MFLOPs per example as the search ranks ``arch`` (:func:`~rankitect.cost.measure`, served
        at the test split's fan-out where ROCS-masked), once per architecture."""
        if arch.hash not in self._mflops:
            from rankitect.cost import measure
            from rankitect.search.trial import candidates_per_request

            fan_out = candidates_per_request(self._data) if arch.rocs else None
            self._mflops[arch.hash] = measure(arch, self._data.spec, fan_out).served_mflops
        return self._mflops[arch.hash]

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        super().tell(arch, result)
        self.score(arch, result)
        self.learn(arch, result)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["climbs"] = self._climbs
        state.update(self.guide_state())
        if self.weights is not None:
            state["logits"] = {label: a.tolist() for label, a in zip(self.weights.labels, self.weights.logits)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._climbs = int(state.get("climbs", 0))
        self.load_guide_state(state)
        if "logits" in state:
            self.weights = ArchitectureWeights(self.space)
            with torch.no_grad():
                for label, a in zip(self.weights.labels, self.weights.logits):
                    a.copy_(torch.tensor(state["logits"][label]))


__all__ = ["ArchStep", "DnasSearch", "Stability", "auto_epochs", "check_dnas_config", "dnas_schedule", "dnas_search"]
