"""Strategy protocol: registry, determinism, resume, duplicates, failures, evolution's rules."""

from __future__ import annotations

import json

import pytest

from rankitect.eval.result import TrialResult
from rankitect.search import STRATEGIES, SpaceExhausted, Strategy, build_strategy, register_strategy
from rankitect.search.strategies.evolution import RegularizedEvolution
from tests.search.toy import ToySpace, toy_result

NAMES = ["random", "evolution", "tpe", "nsga2"]
# small populations so that the model-based part of every strategy runs within a few trials
OPTIONS = {
    "random": {},
    "evolution": {"population": 4, "sample_size": 2},
    "tpe": {"n_startup_trials": 3},
    "nsga2": {"population_size": 4},
}


def make(name: str, seed: int = 0, space: ToySpace | None = None) -> Strategy:
    return build_strategy(name, space or ToySpace(), seed=seed, **OPTIONS[name])


def run(strategy: Strategy, n: int, batch: int = 1) -> list[str]:
    """Ask ``batch`` at a time (a pool of workers), tell them in reverse order; the hashes asked."""
    hashes = []
    for _ in range(0, n, batch):
        archs = [strategy.ask() for _ in range(batch)]
        hashes += [a.hash for a in archs]
        for a in reversed(archs):
            strategy.tell(a, toy_result(a))
    return hashes


def test_registry_holds_the_four_strategies_and_refuses_a_second_of_a_name():
    assert set(NAMES) <= set(STRATEGIES)
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("random")(RegularizedEvolution)


def test_build_strategy_rejects_unknown_names_and_options():
    with pytest.raises(ValueError, match="unknown strategy 'annealing'"):
        build_strategy("annealing", ToySpace(), seed=0)
    with pytest.raises(ValueError, match=r"unknown options \['populaton'\]"):
        build_strategy("evolution", ToySpace(), seed=0, populaton=4)
    with pytest.raises(ValueError, match="sample_size"):
        build_strategy("evolution", ToySpace(), seed=0, population=4, sample_size=5)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_and_results_give_the_same_architectures(name):
    first, second = run(make(name, seed=3), 14, batch=2), run(make(name, seed=3), 14, batch=2)
    assert first == second
    assert run(make(name, seed=4), 14, batch=2) != first


@pytest.mark.parametrize("name", NAMES)
def test_never_proposes_a_genotype_twice(name):
    hashes = run(make(name), 24, batch=3)
    assert len(set(hashes)) == len(hashes)


@pytest.mark.parametrize("name", NAMES)
def test_restored_strategy_continues_exactly(name):
    original = make(name, seed=1)
    run(original, 9, batch=3)
    pending = [original.ask(), original.ask()]  # in flight when the checkpoint is written
    state = json.loads(json.dumps(original.state_dict(), allow_nan=False))
    restored = make(name, seed=1)
    restored.load_state_dict(state)
    for strategy in (original, restored):
        for a in pending:
            strategy.tell(a, toy_result(a))
    assert run(restored, 9, batch=3) == run(original, 9, batch=3)


@pytest.mark.parametrize("name", NAMES)
def test_telling_an_unasked_or_already_told_architecture_is_an_error(name):
    strategy = make(name)
    arch = strategy.ask()
    strategy.tell(arch, toy_result(arch))
    with pytest.raises(ValueError, match="not asked"):
        strategy.tell(arch, toy_result(arch))


@pytest.mark.parametrize("name", ["random", "evolution", "tpe"])
def test_exhausting_a_tiny_space_raises(name):
    space = ToySpace(widths=(8, 16), max_depth=1)  # 4 genotypes
    strategy = build_strategy(name, space, seed=0, max_retries=200, **OPTIONS[name] | (
        {"population": 2, "sample_size": 1} if name == "evolution" else {}))
    assert len(set(run(strategy, 4))) == 4
    with pytest.raises(SpaceExhausted):
        strategy.ask()


def test_load_state_dict_refuses_another_strategy():
    with pytest.raises(ValueError, match="'random' loaded into 'evolution'"):
        make("evolution").load_state_dict(make("random").state_dict())


def test_trial_result_validation():
    with pytest.raises(ValueError, match="finite val_ne"):
        TrialResult(val_ne=float("nan"), mflops=1.0)
    with pytest.raises(ValueError, match="status"):
        TrialResult(status="crashed")
    r = TrialResult.from_metrics({"val/ne": 0.8, "test/ne": 0.81, "test/auc": 0.7, "test/logloss": 0.4}, mflops=2.0)
    assert TrialResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(ValueError, match="unknown TrialResult keys"):
        TrialResult.from_dict({"ne": 1.0})


def test_strategy_from_config():
    from rankitect.config import load_config
    from rankitect.errors import ConfigError
    from rankitect.search.factory import strategy_from_config

    cfg = load_config(overrides=["search.strategy=evolution", "search.evolution.population=3",
                                 "search.evolution.sample_size=2", "search.target_mflops=5.0"])
    strategy = strategy_from_config(cfg.search, ToySpace())
    assert (strategy.name, strategy.population, strategy.sample_size) == ("evolution", 3, 2)
    assert strategy.objective.target_mflops == 5.0 and strategy.objective.penalty == cfg.search.penalty
    with pytest.raises(ConfigError, match="search.study_name"):
        strategy_from_config(load_config(overrides=["search.storage=sqlite:///x.db"]).search, ToySpace())
    with pytest.raises(ConfigError, match="search.strategy"):
        strategy_from_config(load_config(overrides=["search.strategy=anneal"]).search, ToySpace())
