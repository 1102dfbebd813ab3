"""Random search: uniform samples of the space, never the same genotype twice.

The baseline every strategy must beat (Li & Talwalkar 2019, arXiv 1902.07638).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankitect.search.base import Space, SpaceExhausted, Strategy, TrialResult, arch_hash, register_strategy
from rankitect.search.history import make_history, observe
from rankitect.search.objective import Objective
from rankitect.search.shared import SharedStudy

if TYPE_CHECKING:
    from rankitect.space import Architecture


def sample_new(space: Space, rng: Any, seen: set[str], max_retries: int) -> tuple[Architecture, str, dict]:
    """A uniform sample whose genotype hash is not in ``seen``: ``(arch, hash, sample)``."""
    for _ in range(max_retries):
        sample = space.sample(rng)
        arch = space.decode(sample)
        h = arch_hash(arch)
        if h not in seen:
            return arch, h, sample
    raise SpaceExhausted(f"no new architecture in {max_retries} random samples ({len(seen)} seen)")


@register_strategy("random")
class RandomSearch(Strategy):
    """Uniform sampling with duplicates rejected by genotype hash.

    Args:
        space, seed, objective: see :class:`~rankitect.search.base.Strategy`.
        max_retries: samples drawn per ask before giving up with ``SpaceExhausted``.
        shared: share the history with other processes through this study (see
            :mod:`rankitect.search.history`; the runner hands it over, :mod:`rankitect.search.shared`).
    """

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, max_retries: int = 100,
        shared: SharedStudy | None = None,
    ) -> None:
        super().__init__(space, seed=seed, objective=objective)
        if max_retries < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries}")
        self.max_retries = max_retries
        self.history = make_history(space, shared)

    def ask(self) -> Architecture:
        for _ in range(self.max_retries):  # start() refuses a genotype another process just took
            arch, h, sample = sample_new(self.space, self.rng, self.history.seen(), self.max_retries)
            if self.history.start(h, sample):
                return arch
        raise SpaceExhausted(f"random: {self.max_retries} proposals in a row were taken by other processes")

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        h = arch_hash(arch)
        if not self.history.is_pending(h):
            raise ValueError(f"told architecture {h} that was not asked (or was told already)")
        self.history.finish(h, self.objective(result), pruned=result.pruned)

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        return observe(self.space, self.history, arch, self.objective(result))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(state["history"])
