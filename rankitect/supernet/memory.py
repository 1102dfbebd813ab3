"""What a supernet will take in memory, known before a single weight is allocated.

The supernet of a space is built on the ``meta`` device (shapes only, no memory, a fraction of a
second), and its training state is counted the way the supernet trainer keeps it
(:class:`~rankitect.supernet.train.SupernetTrainer`): the widest weights once, Adam's two
moments for every dense weight (they are allocated on a weight's first step), and row-wise
Adagrad's one accumulator per embedding row. What one step's path needs on top (its cut weights,
gradients and activations) is path-sized and small next to that.

>>> from rankitect.space import get_space
>>> from rankitect.space.testing import tiny_spec
>>> space = get_space("nasrec", num_blocks=2, widths=(8, 16), tokens=(2, 4), embedding_dim=4, merge_tokens=2)
>>> memory = estimate_supernet_memory(space, tiny_spec())
>>> memory.total == memory.weights + memory.optimizer
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankitect.data.spec import FeatureSpec
from rankitect.space.space import SearchSpace

BYTES = 4  # float32 weights and optimizer state


@dataclass(frozen=True)
class SupernetMemory:
    """Bytes of a supernet's weights and training state, and the largest sites' weight counts.

    Args:
        dense_params: weights outside the embedding tables.
        embedding_params: weights of the embedding tables.
        embedding_rows: rows of the embedding tables (one Adagrad accumulator each).
        sites: ``(name, weights)`` of the supernet's sites (and ``head``), largest first.
    """

    dense_params: int
    embedding_params: int
    embedding_rows: int
    sites: tuple[tuple[str, int], ...]

    @property
    def weights(self) -> int:
        return BYTES * (self.dense_params + self.embedding_params)

    @property
    def optimizer(self) -> int:
        """Adam's two moments of every dense weight and Adagrad's accumulator per embedding row."""
        return BYTES * (2 * self.dense_params + self.embedding_rows)

    @property
    def total(self) -> int:
        return self.weights + self.optimizer

    def describe(self, top: int = 3) -> str:
        """One line: the total in GB, its parts, and the largest sites."""
        biggest = ", ".join(f"{name} {n / 1e6:.1f}M" for name, n in self.sites[:top])
        return (f"{self.total / 1e9:.2f} GB ({(self.dense_params + self.embedding_params) / 1e6:.1f}M weights: "
                f"{self.embedding_params / 1e6:.1f}M in embedding tables, largest sites {biggest}; "
                f"optimizer state {self.optimizer / 1e9:.2f} GB)")


def estimate_supernet_memory(space: SearchSpace, spec: FeatureSpec) -> SupernetMemory:
    """The memory of ``Supernet(space, spec)`` and its training state, from a meta-device build."""
    from rankitect.supernet.model import Supernet

    with torch.device("meta"):
        supernet = Supernet(space, spec)
    embedding = sum(p.numel() for p in supernet.embedding.parameters())
    rows = sum(p.shape[0] for p in supernet.embedding.parameters())
    total = sum(p.numel() for p in supernet.parameters())
    sites = [(name, sum(p.numel() for p in op.parameters())) for name, op in supernet.ops.items()]
    sites.append(("head", sum(p.numel() for p in supernet.head.parameters())))
    sites.sort(key=lambda s: -s[1])
    return SupernetMemory(total - embedding, embedding, rows, tuple(sites))


def physical_memory() -> int | None:
    """Bytes of RAM of this machine (``None`` where the OS does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


__all__ = ["SupernetMemory", "estimate_supernet_memory", "physical_memory"]
