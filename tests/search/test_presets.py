"""Every strategy on the real presets: proposals in the space, no duplicates, determinism, resume."""

from __future__ import annotations

import json

import pytest

from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from rankitect.space import get_space

OPTIONS = {"random": {}, "evolution": {"population": 4, "sample_size": 2}, "tpe": {"n_startup_trials": 4},
           "nsga2": {"population_size": 4}}


def fake_result(arch) -> TrialResult:
    """Deterministic numbers from the genotype hash (one in sixteen trials fails)."""
    h = arch.hash
    if h[0] == "0":
        return TrialResult.failure("diverged")
    return TrialResult(val_ne=0.7 + int(h[1:5], 16) / 65535 * 0.1, mflops=1.0 + int(h[5:9], 16) / 6553.5)


def run(strategy, n: int) -> list:
    archs = []
    for _ in range(n // 2):
        pair = [strategy.ask(), strategy.ask()]
        archs += pair
        for a in pair:
            strategy.tell(a, fake_result(a))
    return archs


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_strategies_on_presets(name, preset):
    space = get_space(preset)
    strategy = build_strategy(name, space, seed=5, **OPTIONS[name])
    archs = run(strategy, 8)
    assert all(space.contains(a) for a in archs)
    assert len({a.hash for a in archs}) == len(archs)
    again = build_strategy(name, get_space(preset), seed=5, **OPTIONS[name])
    assert [a.hash for a in run(again, 8)] == [a.hash for a in archs]
    restored = build_strategy(name, get_space(preset), seed=5, **OPTIONS[name])
    restored.load_state_dict(json.loads(json.dumps(strategy.state_dict())))
    assert [a.hash for a in run(restored, 4)] == [a.hash for a in run(strategy, 4)]
