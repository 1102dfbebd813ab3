"""Random search: uniform samples of the space, never the same genotype twice.

The baseline every strategy must beat (Li & Talwalkar 2019, arXiv 1902.07638). With a surrogate
(``search.surrogate``, :mod:`rankitect.search.proposing.surrogate`) each proposal draws ``candidates`` new
samples and trains the one the surrogate, fitted on every finished trial, ranks best.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.base import Space, SpaceExhausted, Strategy, arch_hash, register_strategy
from rankitect.search.proposing.history import make_history, observe
from rankitect.search.running.shared_study import SharedStudy
from rankitect.search.proposing.surrogate import Guide, Guided

if TYPE_CHECKING:
    from rankitect.config import SurrogateConfig
    from rankitect.search.base import SearchContext
    from rankitect.space import Architecture


def sample_new(space: Space, rng: Any, seen: set[str], max_retries: int,
               keep: Callable[[Architecture], bool] | None = None) -> tuple[Architecture, str, dict]:
    """A uniform sample whose genotype hash is not in ``seen`` (and that ``keep`` accepts, where
    given): ``(arch, hash, sample)``."""
    for _ in range(max_retries):
        sample = space.sample(rng)
        arch = space.decode(sample)
        h = arch_hash(arch)
        if h not in seen and (keep is None or keep(arch)):
            return arch, h, sample
    raise SpaceExhausted(f"no new architecture in {max_retries} random samples ({len(seen)} seen)")


def draw_new(space: Space, rng: Any, seen: set[str], max_retries: int, k: int,
             keep: Callable[[Architecture], bool] | None = None) -> list[tuple[Architecture, str, dict]]:
    """Up to ``k`` uniform samples new to ``seen`` and to each other (:func:`sample_new`, with
    ``keep``); fewer when the space runs out, none only by raising ``SpaceExhausted``."""
    found: list[tuple[Architecture, str, dict]] = []
    taken = set(seen)
    for _ in range(k):
        try:
            arch, h, sample = sample_new(space, rng, taken, max_retries, keep)
        except SpaceExhausted:
            if found:
                break
            raise
        found.append((arch, h, sample))
        taken.add(h)
    return found


class GuidedHistory(Guided):
    """What ``random`` and ``evolution`` share: a history of flat samples (``self.history`` over
    ``self.space``) beside an optional guide, both kept in the strategy's state; a tell finishes
    the asked architecture in the history and teaches the guide."""

    space: Space
    history: Any

    def start(self, context: SearchContext) -> None:
        if self.guide is not None:
            self.guide.use_data(context.data)

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        h = arch_hash(arch)
        if not self.history.is_pending(h):
            raise ValueError(f"told architecture {h} that was not asked (or was told already)")
        self.history.finish(h, self.objective(result), pruned=result.pruned)
        self.learn(arch, result)

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        self.learn(arch, result)
        return observe(self.space, self.history, arch, self.objective(result))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": self.history.state_dict(), **self.guide_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(state["history"])
        self.load_guide_state(state)


@register_strategy("random")
class RandomSearch(GuidedHistory, Strategy):
    """Uniform sampling with duplicates rejected by genotype hash.

    Args:
        space, seed, objective: see :class:`~rankitect.search.base.Strategy`.
        max_retries: samples drawn per ask before giving up with ``SpaceExhausted``.
        shared: share the history with other processes through this study (see
            :mod:`rankitect.search.proposing.history`; the runner hands it over, :mod:`rankitect.search.running.shared_study`).
        surrogate: ``search.surrogate``: rank ``candidates`` samples per ask (None or disabled: one).
    """

    def __init__(
        self, space: Space, *, seed: int, objective: Objective | None = None, max_retries: int = 100,
        shared: SharedStudy | None = None, surrogate: SurrogateConfig | None = None,
    ) -> None:
        super().__init__(space, seed=seed, objective=objective)
        if max_retries < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries}")
        self.max_retries = max_retries
        self.history = make_history(space, shared)
        self.guide = Guide.from_config(space, seed, surrogate)

    def ask(self) -> Architecture:
        for _ in range(self.max_retries):  # start() refuses a genotype another process just took
            found = draw_new(self.space, self.rng, self.history.seen(), self.max_retries, self.candidates_now())
            arch, h, sample = found[self.pick([f[0] for f in found])]
            if self.history.start(h, sample):
                return arch
        raise SpaceExhausted(f"random: {self.max_retries} proposals in a row were taken by other processes")
