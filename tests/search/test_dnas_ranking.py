"""The supernet's order of probe paths: readings, a stop once it holds, and DNAS handing over to
retraining where the supernet ranks the trained baselines worse than search.dnas.ranking.min_kendall_tau."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankitect.config import DnasConfig, RankingConfig, SupernetConfig
from rankitect.data.store import ClickData
from rankitect.eval.result import TrialResult
from rankitect.search.base import SearchContext
from rankitect.search.strategies.dnas import DnasSearch
from rankitect.eval.objective import Objective
from rankitect.supernet.dnas_phase import dnas_search
from rankitect.supernet.dnas_weights import ArchitectureWeights
from rankitect.supernet.rank_check import RankCheck, probe_check
from rankitect.supernet.train import build_supernet, evaluate_path
from tests.search.test_dnas import _NoTracker
from tests.supernet.test_dnas_phase import TRAIN, _Steps, three_slots
from tests.search.tiny_data import tiny_click_data


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ClickData:
    return tiny_click_data(tmp_path_factory.mktemp("dnas_ranking") / "data", rows=1024)


def paths(space, n: int, seed: int = 0) -> list[dict]:
    rng, out, seen = np.random.default_rng(seed), [], set()
    while len(out) < n:
        sample = space.sample(rng)
        if space.decode(sample).hash not in seen:
            seen.add(space.decode(sample).hash)
            out.append(sample)
    return out


def test_readings_compare_with_the_last_and_with_the_known_nes(data: ClickData) -> None:
    space = three_slots()
    supernet = build_supernet(space, data.spec, 0)
    with torch.random.fork_rng():  # the output layer starts at zero, where every path scores alike
        torch.manual_seed(1)
        for p in supernet.head.parameters():
            torch.nn.init.normal_(p, std=0.1)
    probes = paths(space, 5)
    val = [b for _, b in zip(range(2), data.split("val").batches(64, shuffle=False))]
    ne = [evaluate_path(supernet, p, val)["ne"] for p in probes]  # the independent scoring
    order = np.argsort(ne)
    truth: list[float | None] = [None] * 5
    for rank, i in enumerate(order[:3]):  # three known, in the supernet's own order: tau 1
        truth[i] = float(rank)
    check = RankCheck(supernet, probes, val, truth=truth, stable_tau=0.8, patience=2)
    first = check.read()
    assert math.isnan(first.tau_previous) and first.tau_truth == pytest.approx(1.0)
    assert list(first.scores) == pytest.approx(ne)
    assert not check.stable and check.known == 3
    check.read()
    assert not check.stable  # held once
    third = check.read()  # nothing trained in between: the same order
    assert third.tau_previous == pytest.approx(1.0) and check.stable
    reversed_truth = [None if t is None else -t for t in truth]
    assert RankCheck(supernet, probes, val, truth=reversed_truth).read().tau_truth == pytest.approx(-1.0)


def test_search_stops_once_the_probes_order_holds(data: ClickData) -> None:
    supernet = build_supernet(three_slots(), data.spec, 0)
    check = RankCheck(supernet, paths(supernet.space, 4), [next(iter(data.split("val").batches(64, shuffle=False)))],
                      stable_tau=-1.0, patience=2)  # any order holds: the second reading after warmup stops it
    cfg = DnasConfig(supernet=SupernetConfig(steps=400, epochs=1e6, log_every=1000), weights_only_steps=5, arch_lr=0.3,
                     stable_steps=1, stop="ranking", ranking=RankingConfig(every=3))
    curves, lines = _Steps(), []
    dnas_search(supernet, data, TRAIN, cfg, Objective(), seed=0, curves=curves, echo=lines.append, rank_check=check)
    assert len(check.readings) == 3 and curves.steps[-1] == 5 + 3 * 3 - 1  # readings after steps 7, 10, 13
    assert "order of 4 probe paths held 2 readings" in lines[0] and "stopped after 14 of 400 steps" in lines[0]


def test_probes_are_the_known_architectures_then_changes_of_the_start(data: ClickData) -> None:
    space = three_slots()
    supernet = build_supernet(space, data.spec, 0)
    known = [(space.decode(p), 0.7 + 0.01 * i) for i, p in enumerate(paths(space, 3))]
    check = probe_check(supernet, known, known[0][0], data.split("val"), batch_size=64, seed=0, probes=6, batches=2)
    assert check.truth == [0.7, 0.71, 0.72, None, None, None] and len(check.batches) == 2
    assert len({space.decode(p).hash for p in check.probes}) == 6
    assert probe_check(supernet, [], None, data.split("val"), batch_size=64, seed=0) is None


@pytest.mark.parametrize("tau", [-0.5, 0.9])
def test_dnas_hands_over_to_retraining_where_the_supernet_cannot_rank(data: ClickData, monkeypatch, tau) -> None:
    space = three_slots()
    weights = ArchitectureWeights(space)
    with torch.no_grad():
        for i, a in enumerate(weights.logits):
            a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(i)))
    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    monkeypatch.setattr("rankitect.supernet.rank_check._tau", lambda scores, other: tau)
    lines: list[str] = []
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=lines.append)
    strategy = DnasSearch(space, seed=0, objective=Objective(), fill=10)
    baselines = [space.decode(p) for p in paths(space, 3, seed=5)]
    for i, b in enumerate(baselines):
        strategy.observe(b, TrialResult(val_ne=0.8 + 0.01 * i, mflops=1.0))
    strategy.start(context)
    said = [ln for ln in lines if "Kendall tau" in ln]
    assert len(said) == 1 and "3 trained baselines" in said[0]
    first = strategy.ask()
    # below the threshold its choice is skipped: the first is a change of the best baseline, prunable
    if tau < DnasConfig().ranking.min_kendall_tau:
        assert "cannot rank here" in said[0] and strategy.plan == [] and strategy.prunable
        assert first != space.decode(weights.argmax())
    else:
        assert "cannot rank" not in said[0] and first == space.decode(weights.argmax()) and not strategy.prunable
