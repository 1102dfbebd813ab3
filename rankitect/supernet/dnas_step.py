"""One step of DNAS's architecture weights, by either estimator of their gradient.

Architecture weights (:class:`~rankitect.supernet.dnas_weights.ArchitectureWeights`, one logit per
option of every label: ops, widths, inputs ...) minimize the expected

    objective.torch_value(NE of the batch, MFLOPs)

(NE times the ``relaxed`` or ``absolute`` cost per doubling of FLOPs beyond the target,
:mod:`rankitect.eval.objective`), by one of two estimators (``search.dnas.estimator``):

* ``reinforce`` (the default): the score function with a leave-one-out baseline. ``reinforce.samples``
  paths are drawn from the distribution and scored on one batch with the weights as they are
  (forward only); each path's log-probability moves by how much better its objective is than the
  others' on the same batch (:meth:`ArchStep.reinforce`). Every option competes on its measured
  score, empty ones (no layer, no cross network) included, the batch's difficulty cancels out of
  each comparison, and a path's FLOPs enter exactly. The weights then step on the first path.
* ``gumbel``: hard Gumbel-softmax samples with a straight-through gradient (GDAS), the
  temperature annealed from ``gumbel.tau_start`` to ``gumbel.tau_end``. The gradient a gate gets is that of
  scaling its option's output, which is near zero for any option the weights have adapted to,
  and an empty option's gate scales nothing, so it gets no signal of its own: its most probable
  path can drift to the cheapest one even with NE alone as the objective. With ``arch_split: train`` one forward
  and one backward step both (:meth:`ArchStep.joint`); with ``val`` the architecture steps on
  validation batches (:meth:`ArchStep.__call__`).

The penalty's gradient of the ``gumbel`` estimator comes from the expected FLOPs, differentiable in
the choice probabilities (:meth:`ArchStep.objective_of`). The loop that takes these steps is
:func:`rankitect.supernet.dnas_phase.dnas_search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from rankitect.data.batch import Batch
from rankitect.eval.objective import Objective
from rankitect.supernet.dnas_weights import ArchitectureWeights, ExpectedFlops
from rankitect.supernet.model import Supernet
from rankitect.supernet.train import SupernetTrainer, frozen


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


__all__ = ["ArchStep"]
