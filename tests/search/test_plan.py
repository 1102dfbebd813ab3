"""Every strategy is a proposer of the one registry; oneshot and dnas propose what their supernet chose."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rankitect.config import DnasConfig, OneShotConfig, SupernetConfig
from rankitect.errors import ConfigError
from rankitect.eval.result import TrialResult
from rankitect.search import STRATEGIES, SearchContext, SpaceExhausted, build_strategy
from rankitect.search.base import register_strategy
from rankitect.search.proposing.plan_proposer import PlanProposer
from rankitect.space import get_space


class Chosen(PlanProposer):
    """A plan proposer whose supernet phase is a fixed list (and counts how often it ran)."""

    name = "chosen"

    def __init__(self, space, *, seed: int, objective=None, archs=()) -> None:
        super().__init__(space, seed=seed, objective=objective)
        self.archs, self.phases = list(archs), 0

    def search(self, context: SearchContext) -> list:
        self.phases += 1
        return list(self.archs)


def context(finished: set[str] = frozenset()) -> SearchContext:
    return SearchContext(data=None, train_cfg=None, seed=0, memory_budget=None, flops_range=None, tracker=None,
                         parent_run_id="p", finished=set(finished), echo=lambda line: None)


def three_archs():
    space = get_space("nasrec")
    rng = np.random.default_rng(0)
    archs = []
    while len(archs) < 3:
        arch = space.decode(space.sample(rng))
        if all(arch.hash != a.hash for a in archs):
            archs.append(arch)
    return space, archs


def test_one_registry_holds_every_strategy_the_config_may_name() -> None:
    assert {"random", "evolution", "tpe", "nsga2", "oneshot", "dnas"} <= set(STRATEGIES)
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("oneshot")(Chosen)


@pytest.mark.parametrize(("name", "config"), [("oneshot", OneShotConfig(supernet=SupernetConfig(top_k=3))),
                                                 ("dnas", DnasConfig(supernet=SupernetConfig(top_k=2)))])
def test_supernet_proposers_are_built_like_the_others(name: str, config) -> None:
    proposer = build_strategy(name, get_space("nasrec"), seed=0, config=config)
    assert proposer.budget(50) == config.supernet.top_k and not proposer.prunable
    with pytest.raises(ConfigError, match="search.rocs"):
        build_strategy(name, get_space("nasrec"), seed=0, config=config, rocs=True)


def test_a_plan_is_proposed_once_each_then_exhausted() -> None:
    space, archs = three_archs()
    proposer = Chosen(space, seed=0, archs=archs)
    proposer.start(context())
    assert proposer.planned() == archs
    asked = [proposer.ask(), proposer.ask()]  # two in flight at once (a pool of workers)
    assert asked == archs[:2]
    for arch in asked:
        proposer.tell(arch, TrialResult(val_ne=0.8, mflops=1.0))
    assert proposer.ask() == archs[2]
    with pytest.raises(SpaceExhausted):
        proposer.ask()
    with pytest.raises(ValueError, match="not asked"):
        proposer.tell(archs[0], TrialResult(val_ne=0.8, mflops=1.0))


def test_a_resumed_plan_runs_no_phase_and_skips_what_was_recorded() -> None:
    space, archs = three_archs()
    first = Chosen(space, seed=0, archs=archs)
    first.start(context())
    first.tell(first.ask(), TrialResult.failure("diverged"))
    state = json.loads(json.dumps(first.state_dict()))
    resumed = Chosen(space, seed=0, archs=[])  # a phase now would plan nothing
    resumed.load_state_dict(state)
    resumed.start(context(finished={archs[1].hash}))  # recorded by the search before it was killed
    assert resumed.phases == 0 and resumed.planned() == archs
    assert resumed.ask() == archs[0]  # told, but not recorded: trained again
    assert resumed.ask() == archs[2]


@pytest.mark.parametrize("name", ["oneshot", "dnas"])
def test_with_or_without_a_time_budget_a_supernet_strategy_trains_search_trials(name: str) -> None:
    from rankitect.config import SearchConfig
    from rankitect.search.factory import strategy_from_config

    space = get_space("nasrec")
    timed = strategy_from_config(SearchConfig(strategy=name, time_budget="5m", trials=7), space)
    untimed = strategy_from_config(SearchConfig(strategy=name, trials=7), space)
    assert timed.budget(7) == timed.plan_size == 7  # retrained best first until the budget is spent
    assert untimed.budget(7) == untimed.plan_size == 7  # like every other strategy
    few = strategy_from_config(SearchConfig(strategy=name, time_budget="5m", trials=1), space)
    assert few.budget(1) == few.config.supernet.top_k  # never fewer than top_k


def test_a_plan_never_retrains_a_baseline() -> None:
    space, archs = three_archs()
    proposer = Chosen(space, seed=0, archs=archs)
    assert proposer.observe(archs[0], TrialResult(val_ne=0.8, mflops=1.0)) is False  # noted, not a start
    assert [a.hash for a in proposer.untrained(archs, 2)] == [archs[1].hash, archs[2].hash]
    assert [a.hash for a in proposer.untrained(archs, 1)] == [archs[1].hash]
