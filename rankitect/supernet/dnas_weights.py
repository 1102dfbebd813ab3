"""DNAS architecture weights over every labelled choice, and the differentiable expected FLOPs.

The distribution over paths is a product of categoricals, one per label: ``p_l = softmax(alpha_l)``.
Training samples it with the Gumbel-softmax trick, hard with a straight-through gradient (GDAS, Dong
& Yang, CVPR'19): the forward pass runs the one sampled path and each label's gate
``one_hot - soft.detach() + soft`` (forward value 1) passes the gradient back to all its logits.

Expected FLOPs are ``sum_i p_i C_i`` taken label by label around the most probable path ``x``:

    E(p) = C(x) + sum_l sum_i p_{l,i} (C(x with label l set to option i) - C(x))

with ``C`` the analytic FLOPs of the blocks (:meth:`Supernet.path_flops`, equal to
``cost(arch, spec).flops``). It is exact for a one-hot ``p`` (then ``x`` is that path), exact for
any ``p`` when the cost adds up over labels, and otherwise the first-order expansion of the cost in
the labels; its gradient in ``p_{l,i}`` is the FLOPs that option ``i`` of label ``l`` adds or saves.

>>> import numpy as np
>>> from rankitect.space import get_space
>>> from rankitect.supernet.model import Supernet
>>> from rankitect.space.testing import tiny_spec
>>> space = get_space("nasrec", num_blocks=2, widths=(8, 16), tokens=(2, 4), embedding_dim=4, merge_tokens=2)
>>> supernet = Supernet(space, tiny_spec())
>>> weights = ArchitectureWeights(space)
>>> path = space.sample(np.random.default_rng(0))
>>> one_hot = weights.one_hot(path)
>>> int(ExpectedFlops(supernet)(one_hot)) == supernet.path_flops(path)
True
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rankitect.space.space import SearchSpace

Path = dict[str, Any]


class ArchitectureWeights(nn.Module):
    """One logit per option of every label of ``space`` (all zero: the uniform distribution).

    Args:
        space: the search space; labels keep the space's order (:meth:`arch_parameters`).
    """

    def __init__(self, space: SearchSpace) -> None:
        super().__init__()
        self.space = space
        self.labels = list(space.choices)
        self.logits = nn.ParameterList(nn.Parameter(torch.zeros(len(c.options))) for c in space.choices.values())

    def arch_parameters(self) -> list[nn.Parameter]:
        """The logits, in module order (the space's label order)."""
        return list(self.logits)

    def _options(self, label: str) -> tuple[Any, ...]:
        return self.space.choices[label].options

    def probs(self) -> dict[str, torch.Tensor]:
        """``softmax(alpha_l)`` per label (differentiable)."""
        return {label: torch.softmax(a, dim=0) for label, a in zip(self.labels, self.logits)}

    def one_hot(self, path: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The distribution that puts all mass on ``path``."""
        out = {}
        for label in self.labels:
            p = torch.zeros(len(self._options(label)))
            p[self.space.choices[label].index(path[label])] = 1.0
            out[label] = p
        return out

    def gumbel(self, generator: torch.Generator, tau: float) -> tuple[Path, dict[str, torch.Tensor]]:
        """A hard Gumbel-softmax sample: the path and, per label, the straight-through one-hot
        ``hard - soft.detach() + soft`` (its value is the one-hot of the path's option)."""
        path, weights = {}, {}
        for label, a in zip(self.labels, self.logits):
            noise = -torch.empty(a.shape).exponential_(generator=generator).log()  # Gumbel(0, 1)
            soft = torch.softmax((a + noise) / tau, dim=0)
            i = int(soft.argmax())
            hard = torch.zeros_like(soft)
            hard[i] = 1.0
            weights[label] = hard - soft.detach() + soft
            path[label] = self._options(label)[i]
        return path, weights

    @torch.no_grad()
    def lean_towards(self, path: Mapping[str, Any], logit: float) -> None:
        """Add ``logit`` to the option ``path`` takes at each label it reads (a search that starts
        around a known architecture: with ``logit > 0`` it is the most probable one)."""
        for label in self.space.active(path):
            self.logits[self.labels.index(label)][self.space.choices[label].index(path[label])] += logit

    def log_prob(self, path: Mapping[str, Any]) -> torch.Tensor:
        """``log p(path)`` over the labels the path's architecture reads (differentiable): labels
        it ignores change nothing about the architecture and carry no credit for its score.

        >>> import numpy as np
        >>> from rankitect.space import get_space
        >>> space = get_space("nasrec", num_blocks=2, widths=(8, 16), tokens=(2, 4), embedding_dim=4, merge_tokens=2)
        >>> w = ArchitectureWeights(space)
        >>> path = space.sample(np.random.default_rng(0))
        >>> sizes = [len(space.choices[label].options) for label in space.active(path)]
        >>> bool(torch.isclose(w.log_prob(path), -torch.tensor(sizes, dtype=torch.float).log().sum()))
        True
        """
        total = torch.zeros(())
        for label in self.space.active(path):
            a = self.logits[self.labels.index(label)]
            total = total + torch.log_softmax(a, dim=0)[self.space.choices[label].index(path[label])]
        return total

    @torch.no_grad()
    def sample(self, generator: torch.Generator) -> Path:
        """A path drawn from the current distribution (Gumbel-max: no temperature, no gradient)."""
        path = {}
        for label, a in zip(self.labels, self.logits):
            noise = -torch.empty(a.shape).exponential_(generator=generator).log()
            path[label] = self._options(label)[int((a + noise).argmax())]
        return path

    @torch.no_grad()
    def argmax(self) -> Path:
        """The most probable path (first option on ties)."""
        return {label: self._options(label)[int(a.argmax())] for label, a in zip(self.labels, self.logits)}

    @torch.no_grad()
    def entropy(self) -> dict[str, float]:
        """Entropy (nats) of each label's distribution."""
        return {label: float(-(p * p.clamp_min(1e-12).log()).sum()) for label, p in self.probs().items()}

    @torch.no_grad()
    def most_probable(self, k: int) -> list[Path]:
        """Up to ``k`` paths of distinct architectures, most probable first: the argmax, then the
        paths that change one active label to another option, by how little probability they lose."""
        best = self.argmax()
        out, seen = [best], {self.space.decode(best).hash}
        for path in self.neighbours(best):
            if len(out) >= k:
                break
            h = self.space.decode(path).hash
            if h not in seen:
                seen.add(h)
                out.append(path)
        return out[:k]

    @torch.no_grad()
    def neighbours(self, path: Mapping[str, Any]) -> list[Path]:
        """Every path one choice away from ``path``: each label it reads set to each other option,
        the change the distribution prefers most first (``log p(new) - log p(old)``, highest first;
        ties in label and option order). Labels ``path`` does not read take their most probable
        option, so a change that brings one into play brings in the option the search chose.

        >>> from rankitect.space import get_space
        >>> space = get_space("nasrec", num_blocks=2, widths=(8, 16), tokens=(2, 4), embedding_dim=4, merge_tokens=2)
        >>> w = ArchitectureWeights(space)
        >>> path = w.argmax()
        >>> len(w.neighbours(path)) == sum(len(space.choices[label].options) - 1 for label in space.active(path))
        True
        >>> w.lean_towards(w.neighbours(path)[-1], 1.0)  # now the last change is the one preferred
        >>> changed = [label for label in path if w.neighbours(path)[0][label] != path[label]]
        >>> w.neighbours(path)[0][changed[0]] == w.argmax()[changed[0]]
        True
        """
        base = {**self.argmax(), **{label: path[label] for label in self.space.active(path)}}
        logp = {label: torch.log_softmax(a, dim=0) for label, a in zip(self.labels, self.logits)}
        moves = []
        for label in self.space.active(base):
            here = self.space.choices[label].index(base[label])
            for i, option in enumerate(self._options(label)):
                if i != here:
                    moves.append((float(logp[label][i] - logp[label][here]), label, option))
        moves.sort(key=lambda m: -m[0])  # stable: ties keep label and option order
        return [{**base, label: option} for _, label, option in moves]

    @torch.no_grad()
    def to_dict(self) -> dict[str, list[float]]:
        """The probabilities as plain data (for logging)."""
        return {label: [round(float(v), 6) for v in p] for label, p in self.probs().items()}


class ExpectedFlops:
    """``E(p)`` of the module docstring for a supernet; the per-label cost tables are cached.

    Args:
        supernet: anything with ``space`` and ``path_flops(path)`` (a :class:`Supernet`).
        cache_size: expansion points whose tables are kept.
    """

    def __init__(self, supernet: Any, cache_size: int = 64) -> None:
        self.supernet, self.space, self.cache_size = supernet, supernet.space, cache_size
        self._tables: OrderedDict[Any, tuple[float, dict[str, torch.Tensor], list[str]]] = OrderedDict()

    def table(self, path: Path, labels: list[str] | None = None) -> tuple[float, dict[str, torch.Tensor]]:
        """``C(x)`` and, per active label (of ``labels``, default all), ``C(x with the label at each
        option)`` as float64; costs are computed once per expansion point and label."""
        active = self.space.active(path)
        key = tuple((label, path[label]) for label in active)  # inactive labels change no cost
        if key not in self._tables:
            self._tables[key] = (float(self.supernet.path_flops(path)), {}, active)
            if len(self._tables) > self.cache_size:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        base, costs, active = self._tables[key]
        wanted = active if labels is None else [label for label in active if label in labels]
        for label in wanted:
            if label not in costs:
                options = self.space.choices[label].options
                costs[label] = torch.tensor([self.supernet.path_flops({**path, label: o}) for o in options],
                                            dtype=torch.float64)
        return base, {label: costs[label] for label in wanted}

    def __call__(self, probs: Mapping[str, torch.Tensor], at: Path | None = None) -> torch.Tensor:
        """Expected FLOPs per example under ``probs`` (label -> option weights), differentiable.

        ``at`` is the expansion point (default: the most probable path of ``probs``); labels whose
        weights are all on the expansion point's option add nothing and are not costed.
        """
        choices = self.space.choices
        path = at if at is not None else {label: choices[label].options[int(p.detach().argmax())]
                                          for label, p in probs.items()}
        moving = [label for label, p in probs.items() if float(p.detach()[choices[label].index(path[label])]) != 1.0]
        base, costs = self.table(path, moving)
        total = torch.tensor(base, dtype=torch.float64)
        for label, c in costs.items():
            total = total + (probs[label].to(torch.float64) * (c - base)).sum()
        return total


def tau_at(step: int, steps: int, start: float, end: float) -> float:
    """Temperature annealed exponentially from ``start`` (step 0) to ``end`` (the last step).

    >>> tau_at(0, 11, 5.0, 0.5), round(tau_at(10, 11, 5.0, 0.5), 6)
    (5.0, 0.5)
    """
    if start <= 0 or end <= 0:
        raise ValueError(f"temperatures must be > 0, got tau_start={start!r}, tau_end={end!r}")
    frac = step / max(1, steps - 1)
    return start * math.exp(frac * math.log(end / start))


__all__ = ["ArchitectureWeights", "ExpectedFlops", "tau_at"]
