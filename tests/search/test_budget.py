"""The time budget reaches every phase as a deadline: a training, a DNAS and a one-shot supernet
past it stop at their next step, with what they have."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from rankitect.config import DnasConfig, OneShotConfig, SupernetConfig, TrainConfig
from rankitect.search.running.budget import TimeBudget
from rankitect.eval.objective import Objective
from rankitect.space import get_space
from rankitect.space.baselines import get_baseline
from rankitect.supernet.dnas_phase import dnas_search
from rankitect.supernet.oneshot_phase import train_supernet
from rankitect.supernet.train import build_supernet
from rankitect.train.loop import train_architecture
from tests.learnable import learnable_source
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_NASREC

TRAIN = TrainConfig(batch_size=64, max_epochs=3, progress=False, grace_steps=0, test_batches=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return tiny_click_data(tmp_path_factory.mktemp("budget") / "data", rows=1024)  # 16 steps an epoch


def test_a_training_past_its_deadline_validates_once_more_and_says_it_stopped(monkeypatch) -> None:
    """A clock that moves one second a step; the deadline 40 s on: the training stops after step 40
    (of 2 epochs of 32), validated there, its best state restored, and says it was stopped."""
    from types import SimpleNamespace

    import rankitect.train.protocol as protocol
    from rankitect.data.store import ClickData

    data = ClickData.open(learnable_source())
    now = [1000.0]
    monkeypatch.setattr(protocol, "time", SimpleNamespace(time=lambda: now[0]))
    steps: list[int] = []

    def tick(step: int, total: int, epoch: int, epochs: int) -> None:
        steps.append(step)
        now[0] += 1.0

    cfg = replace(TRAIN, max_epochs=2, grace_steps=64)
    out = train_architecture(get_baseline("dlrm", data.spec), data, cfg, deadline=1040.0, on_step=tick)
    assert steps == list(range(1, 41)) and out.steps == 40 and out.stopped == "time budget"
    assert [h["step"] for h in out.history] == [32.0, 40.0]  # the epoch's validation, then one at the cut
    best = min(out.history, key=lambda h: h["val/ne"])
    assert out.metrics["val/ne"] == best["val/ne"] and out.best_step == best["step"]
    now[0] = 0.0
    full = train_architecture(get_baseline("dlrm", data.spec), data, cfg, deadline=1040.0)
    assert full.stopped is None and full.steps == 64


def test_a_dnas_supernet_past_its_deadline_stops_at_its_next_step(data) -> None:
    space = get_space("nasrec", **{**SMALL_NASREC, "num_blocks": 2})
    supernet, lines, steps = build_supernet(space, data.spec, 0), [], []
    cfg = DnasConfig(supernet=SupernetConfig(steps=400, epochs=1e6), weights_only_steps=5, stable_steps=0)
    dnas_search(supernet, data, TRAIN, cfg, Objective(), seed=0, echo=lines.append, deadline=time.time(),
                on_step=lambda step, total: steps.append((step, total)))
    assert steps == [(1, 400)] and lines == ["dnas: stopped by the time budget after 1 of 400 steps"]


def test_a_oneshot_supernet_past_its_deadline_stops_at_its_next_step(data) -> None:
    space = get_space("nasrec", **{**SMALL_NASREC, "num_blocks": 2})
    supernet = build_supernet(space, data.spec, 0)
    cfg = OneShotConfig(supernet=SupernetConfig(steps=20, epochs=100.0), widest_decay_steps=5)
    losses = train_supernet(supernet, data, TRAIN, cfg, seed=0, deadline=time.time())
    assert len(losses) == 1
    assert len(train_supernet(build_supernet(space, data.spec, 0), data, TRAIN, cfg, seed=0)) == 20


def test_the_deadline_is_the_budget_left_from_now() -> None:
    clock = iter([0.0, 40.0, 40.0]).__next__  # start, then two reads at 40 s
    budget = TimeBudget(100.0, clock=clock, elapsed=30.0)  # 30 s spent before a resume
    before = time.time()
    deadline = budget.deadline()  # 100 - 30 - 40 = 30 s from now
    assert before + 30.0 <= deadline <= time.time() + 30.0
    assert budget.left() == 30.0 and TimeBudget(None).deadline() is None


def test_a_trial_stopped_at_the_early_rung_counts_as_a_reduction_th_of_a_proposal() -> None:
    """Proposals stop at ``trials * reduction``; a trial stopped at the early rung cost about a
    ``reduction``-th of one pruned at the first rung, and counts as that share of a proposal."""
    from types import SimpleNamespace

    from rankitect.eval.result import TrialResult
    from rankitect.search.judging.pruning import EARLY_PRUNED
    from rankitect.search.running.budget import TrialSlots

    strategy = SimpleNamespace(budget=lambda trials: trials, prunable=True)
    slots = TrialSlots(strategy, 2, reduction=3)

    def pruned(message: str) -> SimpleNamespace:
        return SimpleNamespace(result=TrialResult.pruning(message, val_ne=0.9, mflops=1.0, params=1,
                                                          train_seconds=1.0, steps=3))

    at_rung = [pruned("pruned after validation 1: ...")] * 4
    assert slots.left(at_rung, 0) == 2 and slots.left([*at_rung, pruned("x")], 0) == 1  # the cap, 6
    probed = [pruned(f"{EARLY_PRUNED} (the probe): ...")] * 4  # 4/3 of a proposal
    assert slots.left([*at_rung, *probed], 0) == 0  # ceil(4 + 4/3) = 6: the cap
    assert slots.left([*at_rung[:3], *probed], 0) == 1  # ceil(3 + 4/3) = 5
    assert slots.left([*at_rung[:3], *probed], 1) == 0  # a running one holds the last
