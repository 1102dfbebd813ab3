"""The DNAS phase: a supernet and architecture weights over every choice of a preset space, trained together.

Each weight step trains the supernet on one path drawn from the current distribution (no dense
work for unsampled options); architecture steps (:class:`~rankitect.supernet.dnas_step.ArchStep`)
move the distribution towards paths of a lower objective. ``arch_split: train`` scores paths on
training batches the weights have not yet seen in this pass (the schedule is at most ``supernet.epochs``
passes); ``val`` on validation batches. The phase is sized to the data (:func:`dnas_schedule`): at
most ``supernet.epochs`` passes over the train split (``auto``, the default: as many as the baselines took
to their best validation, :func:`auto_epochs`), and it stops once the most probable architecture
has held for ``stable_steps`` architecture steps (:class:`Stability`), or, with ``stop: ranking``,
once the supernet's order of its probe paths holds (:mod:`rankitect.supernet.rank_check`). It starts
around the best trained baseline the space holds (``start_logit`` more per choice), as the sampling
strategies start from the baselines. The entropy of every choice, the expected MFLOPs and the
temperature are logged as curves in batches.

:func:`dnas_phase` runs it all and returns what it found (:class:`DnasOutcome`); the ``dnas``
strategy (:mod:`rankitect.search.strategies.dnas`) keeps the supernet's run and retrains what the
weights chose.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from tqdm import tqdm

from rankitect.config import DnasConfig, TrainConfig

from rankitect.config_rules import check_section
from rankitect.data.batch import Batch
from rankitect.data.clickdata import epoch_batches
from rankitect.eval.objective import Objective
from rankitect.supernet.dnas_step import ArchStep
from rankitect.supernet.dnas_weights import ArchitectureWeights, ExpectedFlops, tau_at
from rankitect.supernet.model import Supernet
from rankitect.supernet.rank_check import RankCheck, probe_check
from rankitect.supernet.train import CurveLogger, SupernetTrainer, batches, set_bucket_edges, supernet_schedule
from rankitect.train.protocol import deadline_passed


def dnas_schedule(cfg: DnasConfig, train_rows: int, batch_size: int) -> tuple[int, int]:
    """Weight steps and weights-only steps of a search on ``train_rows`` training rows: ``supernet.steps``
    or ``supernet.epochs`` passes over the train split, whichever is fewer, the weights-only steps keeping their share
    (:func:`~rankitect.supernet.train.supernet_schedule`, as one-shot's); the temperature anneals
    over the steps run. ``epochs: auto`` not yet resolved (:func:`auto_epochs`) is one pass.

    >>> from rankitect.config import SupernetConfig
    >>> one_pass = DnasConfig(supernet=SupernetConfig(steps=300, epochs=1.0))
    >>> dnas_schedule(one_pass, 80_000, 512), dnas_schedule(one_pass, 10**6, 512)
    ((156, 26), (300, 50))
    """
    epochs = 1.0 if cfg.supernet.epochs == "auto" else cfg.supernet.epochs
    return supernet_schedule(cfg.supernet.steps, cfg.weights_only_steps, epochs, train_rows, batch_size)


def auto_epochs(best_steps: list[int], train_rows: int, batch_size: int) -> float:
    """``search.dnas.supernet.epochs: auto``: the median over the trained baselines of the epochs they took to
    their best validation, at least 1 (1 without any). On data where models improve for many
    epochs a supernet that sees each row once has learnt too little to rank paths by; on data whose
    models peak in their first epoch, one pass is what they need too.

    >>> auto_epochs([3 * 156, 9 * 156, 5 * 156], 80_000, 512), auto_epochs([100], 80_000, 512), auto_epochs([], 10, 5)
    (5.0, 1.0, 1.0)
    """
    if not best_steps:
        return 1.0
    return max(1.0, statistics.median(best_steps) / epoch_batches(train_rows, batch_size))


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
    order of its probe paths is read every ``cfg.ranking.every`` steps after the weights-only steps (logged as
    ``rank/*``); with ``cfg.stop == "ranking"`` the loop stops once that order holds instead. Past
    ``deadline`` (a ``time.time()`` instant: the search's time budget) the loop stops with the
    weights it has; ``on_step(step, steps)`` sees every step.
    """
    check_section(cfg, "search.dnas")
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
        tau = tau_at(step, steps, cfg.gumbel.tau_start, cfg.gumbel.tau_end)
        arch_now = step >= warmup and (step - warmup) % cfg.arch_every == 0
        reinforce = cfg.estimator == "reinforce"
        if arch_now and cfg.arch_split == "train":  # one pass over the batch steps weights and architecture
            row = (arch_step.reinforce(next(train_it), generator, cfg.reinforce.samples, train=True) if reinforce
                   else arch_step.joint(next(train_it), generator, tau))
        else:
            row = {"train/loss": trainer.step(next(train_it), weights.sample(generator))}
            if arch_now:
                row.update(arch_step.reinforce(next(val_it), generator, cfg.reinforce.samples) if reinforce
                           else arch_step(next(val_it), generator, tau))
        row["train/skipped"] = float(trainer.skipped)
        done = arch_now and stable.update(weights.argmax()) and cfg.stop == "argmax"
        if rank_check is not None and step >= warmup and (step + 1 - warmup) % cfg.ranking.every == 0:
            reading = rank_check.read()  # stop: ranking, once the supernet's order of the probes holds
            row.update({"rank/tau_previous": reading.tau_previous, "rank/tau_baselines": reading.tau_truth})
            done = done or (cfg.stop == "ranking" and rank_check.stable)
        if curves is not None and (step % cfg.supernet.log_every == 0 or step == steps - 1 or done):
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
    schedule, which ``supernet.epochs`` and ``supernet.steps`` bound.

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


@dataclass
class DnasOutcome:
    """What a DNAS phase found.

    Args:
        weights: the trained architecture weights (their most probable paths are its choice).
        check: the supernet's ranking of the trained baselines it holds and of changes of the
            start (:func:`~rankitect.supernet.rank_check.probe_check`); ``None`` with fewer than two probes.
    """

    weights: ArchitectureWeights
    check: RankCheck | None


def dnas_phase(
    supernet: Supernet, data: Any, train_cfg: TrainConfig, cfg: DnasConfig, objective: Objective, *, seed: int,
    known: list[tuple[Any, float]], start: Any | None, best_steps: list[int], echo: Callable[[str], None],
    curves: CurveLogger | None = None, progress: bool = False, deadline: float | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> DnasOutcome:
    """:func:`dnas_search` on ``supernet``, ``epochs: auto`` resolved from ``best_steps`` (the steps
    the trained baselines took to their best validation, :func:`auto_epochs`), leaning towards
    ``start`` (the best trained architecture the space holds, or ``None``) and reading its ranking of
    ``known`` (trained architectures and their validation NE) as it goes; what it does is said
    through ``echo``."""
    rows, batch_size = len(data.split("train")), train_cfg.batch_size
    if cfg.supernet.epochs == "auto":
        cfg = replace(cfg, supernet=replace(cfg.supernet, epochs=auto_epochs(best_steps, rows, batch_size)))
        echo(f"dnas: epochs auto: {cfg.supernet.epochs:.1f} (the baselines' median epochs to their best validation)")
    steps, warmup = dnas_schedule(cfg, rows, batch_size)
    echo(f"dnas: supernet of {sum(p.numel() for p in supernet.parameters()):,} parameters, "
         f"at most {steps} steps (architecture steps from step {warmup})")
    check = probe_check(supernet, known, start, data.split("val"), batch_size=batch_size, seed=seed)
    weights = dnas_search(supernet, data, train_cfg, cfg, objective, seed=seed, curves=curves, progress=progress,
                          echo=echo, start=None if start is None else supernet.space.encode(start),
                          rank_check=check if cfg.stop == "ranking" else None, deadline=deadline, on_step=on_step)
    return DnasOutcome(weights, check)


__all__ = ["DnasOutcome", "Stability", "auto_epochs", "dnas_phase", "dnas_schedule", "dnas_search"]
