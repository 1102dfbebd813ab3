"""A tiny search space implementing the protocol strategies program against, and a toy trainer.

Architecture: ``depth`` layers with widths ``w0..w2``; widths beyond ``depth`` are irrelevant, so
different samples can decode to one genotype (which the strategies must treat as a duplicate).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankitect.eval.result import TrialResult


@dataclass(frozen=True)
class ToyChoice:
    label: str
    options: tuple[Any, ...]


@dataclass(frozen=True)
class ToyArch:
    widths: tuple[int, ...]
    act: str | None

    @property
    def hash(self) -> str:
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps({"widths": list(self.widths), "act": self.act}, sort_keys=True)


class ToySpace:
    def __init__(self, widths: tuple[int, ...] = (8, 16, 32, 64), max_depth: int = 3) -> None:
        labels = {"depth": tuple(range(1, max_depth + 1)), "act": ("relu", None)}
        labels.update({f"w{i}": widths for i in range(max_depth)})
        self.choices = {k: ToyChoice(k, v) for k, v in labels.items()}
        self.mutated_from: list[ToyArch] = []  # parents passed to mutate, for tests

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        return {k: c.options[int(rng.integers(len(c.options)))] for k, c in self.choices.items()}

    def decode(self, sample: dict[str, Any]) -> ToyArch:
        return ToyArch(tuple(sample[f"w{i}"] for i in range(sample["depth"])), sample["act"])

    def encode(self, arch: ToyArch) -> dict[str, Any]:
        first = {k: c.options[0] for k, c in self.choices.items()}
        return {**first, "depth": len(arch.widths), "act": arch.act,
                **{f"w{i}": w for i, w in enumerate(arch.widths)}}

    def mutate(self, arch: ToyArch, rng: np.random.Generator, num_mutations: int = 1) -> ToyArch:
        self.mutated_from.append(arch)
        sample = self.encode(arch)
        for _ in range(num_mutations):
            labels = [k for k, c in self.choices.items() if len(c.options) > 1]
            label = labels[int(rng.integers(len(labels)))]
            others = [o for o in self.choices[label].options if o != sample[label]]
            sample[label] = others[int(rng.integers(len(others)))]
        return self.decode(sample)


def toy_result(arch: ToyArch) -> TrialResult:
    """A deterministic stand-in for training: wider is better and costlier; depth 3 with a
    64 in the middle 'diverges'."""
    if len(arch.widths) == 3 and arch.widths[1] == 64:
        return TrialResult.failure("loss is NaN")
    mflops = sum(2.0 * w * w for w in arch.widths) / 1e3
    ne = 0.9 - 0.02 * np.log2(sum(arch.widths)) + (0.01 if arch.act is None else 0.0)
    return TrialResult(val_ne=float(ne), test_ne=float(ne) + 0.001, test_auc=0.7, test_logloss=0.5,
                       mflops=mflops, params=sum(arch.widths) * 10, train_seconds=1.0)
