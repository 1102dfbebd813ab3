"""Regularized evolution's rules: random initial population, tournament by objective, ageing."""

from __future__ import annotations

from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from tests.search.toy import ToySpace


def ok(ne: float) -> TrialResult:
    return TrialResult(val_ne=ne, mflops=1.0)


def test_initial_population_is_random_then_children_are_mutations():
    space = ToySpace()
    evo = build_strategy("evolution", space, seed=0, population=4, sample_size=2)
    first = [evo.ask() for _ in range(6)]  # nothing finished yet: all uniform samples
    assert space.mutated_from == []
    for i, arch in enumerate(first[:4]):
        evo.tell(arch, ok(0.5 + i))
    evo.ask()
    assert len(space.mutated_from) >= 1 and space.mutated_from[0] in first[:4]


def test_tournament_winner_has_the_lowest_objective_and_failed_trials_never_win():
    space = ToySpace()
    evo = build_strategy("evolution", space, seed=1, population=4, sample_size=4)  # whole population
    archs = [evo.ask() for _ in range(4)]
    evo.tell(archs[0], TrialResult.failure("diverged"))
    evo.tell(archs[1], ok(0.7))
    evo.tell(archs[2], TrialResult.failure("out of memory"))
    evo.tell(archs[3], ok(0.6))
    for _ in range(10):
        evo.ask()
    assert set(space.mutated_from) == {archs[3]}


def test_stopped_trials_neither_join_nor_age_the_population():
    """A run of pruned or failed candidates must not push the trained members out: the tournament
    keeps drawing from the ``population`` most recent trained trials."""
    space = ToySpace()
    evo = build_strategy("evolution", space, seed=3, population=2, sample_size=2)
    good, fair = evo.ask(), evo.ask()
    evo.tell(good, ok(0.2))
    evo.tell(fair, ok(0.5))
    for i in range(6):  # many more stopped trials than the population holds
        child = evo.ask()
        stopped = TrialResult.pruning("rung 0", val_ne=0.1, mflops=1.0, params=1, train_seconds=1.0, steps=10) if i % 2 else TrialResult.failure("nan")
        evo.tell(child, stopped)
    space.mutated_from.clear()
    for _ in range(10):
        evo.ask()
    assert set(space.mutated_from) == {good}  # still there, and still the best of the two
    trained = evo.ask()
    evo.tell(trained, ok(0.9))  # a trained newcomer ages the oldest trained member (good) out
    space.mutated_from.clear()
    for _ in range(10):
        evo.ask()
    assert set(space.mutated_from) == {fair}


def test_objective_penalty_decides_the_tournament():
    space = ToySpace()
    evo = build_strategy("evolution", space, seed=1, population=2, sample_size=2,
                         objective=Objective(target_mflops=1.0, penalty="relaxed", weight=1.0))
    small, big = evo.ask(), evo.ask()
    evo.tell(small, TrialResult(val_ne=0.70, mflops=1.0))  # objective 0.70
    evo.tell(big, TrialResult(val_ne=0.60, mflops=2.0))  # better NE, objective 0.60 + 1.0
    evo.ask()
    assert set(space.mutated_from) == {small}


def test_the_oldest_leaves_the_population_however_good():
    space = ToySpace()
    evo = build_strategy("evolution", space, seed=2, population=2, sample_size=2)
    a, b = evo.ask(), evo.ask()
    evo.tell(a, ok(0.1))  # the best ever seen
    evo.tell(b, ok(0.9))
    child = evo.ask()
    assert space.mutated_from[-1] == a
    evo.tell(child, ok(0.8))  # population is now [b, child]: a has aged out
    space.mutated_from.clear()
    evo.ask()
    assert set(space.mutated_from) == {child}
