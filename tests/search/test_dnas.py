"""The ``dnas`` strategy: baselines taken, epochs: auto, the climb after the phase, resume, CLI end to end
(the phase itself: tests/supernet/test_dnas_phase.py)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rankitect.cli import main
from rankitect.config import DnasConfig, SupernetConfig
from rankitect.data.store import ClickData
from rankitect.eval.objective import Objective
from rankitect.space import cost, get_space
from rankitect.space.architecture import Architecture
from rankitect.space.testing import tiny_spec
from rankitect.supernet.dnas_phase import dnas_schedule
from rankitect.supernet.dnas_weights import ArchitectureWeights
from tests.learnable import learnable_source
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_NASREC
from tests.supernet.test_dnas_phase import TRAIN, three_slots


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ClickData:
    return tiny_click_data(tmp_path_factory.mktemp("dnas") / "data", rows=1024)


def test_dnas_search_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    # A small nasrec menu: the mechanics are those of any space.
    monkeypatch.setattr("rankitect.search.proposing.sizing.get_space", lambda name, **kw: get_space(
        name, **{**SMALL_NASREC, "num_blocks": 2}))
    code = main(["search", "--strategy", "dnas", "--target-mflops", "0.01", f"data.source={learnable_source()}",
                 "search.trials=1", "train.max_epochs=1", "search.space=nasrec", "search.flops_range=null",
                 "train.batch_size=64", "train.val_batches=2", "train.test_batches=2",
                 "train.progress=false", "search.dnas.supernet.steps=12", "search.dnas.weights_only_steps=4",
                 "search.dnas.supernet.log_every=4", "search.baselines=[dlrm]", "runtime.threads=1", "search.workers=1"])
    assert code == 0
    out = capsys.readouterr().out
    parent = out.split("MLflow search run: ")[1].split()[0]
    assert "winner " in out and "dlrm" in out
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'")
    kinds = sorted(r.data.tags["rankitect.kind"] for r in runs)
    assert kinds == ["baseline", "candidate", "supernet"]
    supernet = next(r for r in runs if r.data.tags["rankitect.kind"] == "supernet")
    assert "arch/expected_mflops" in supernet.data.metrics and "entropy/b0.flat" in supernet.data.metrics
    history = client.get_metric_history(supernet.info.run_id, "entropy/b0.flat")
    assert [m.step for m in history] == [0, 4, 8, 11]
    candidate = next(r for r in runs if r.data.tags["rankitect.kind"] == "candidate")
    assert {"test/ne", "test/auc", "mflops"} <= set(candidate.data.metrics)
    # the supernet is kept, and a candidate can start fine-tuning from the weights cut out of it
    files = client.list_artifacts(supernet.info.run_id, "supernet")
    assert {"supernet/weights.safetensors", "supernet/space.json", "supernet/feature_spec.json"} <= {f.path for f in files}
    code = main(["finetune", candidate.info.run_id, "--from-supernet", "--steps", "32",
                 f"data.source={learnable_source()}", "train.batch_size=64", "train.val_batches=2",
                 "train.test_batches=2", "train.progress=false", "runtime.threads=1", "search.workers=1"])
    assert code == 0
    new = capsys.readouterr().out.split("MLflow run: ")[1].split()[0]
    assert client.get_run(new).data.tags["rankitect.start"] == "supernet"

    # Killed after the supernet phase chose its winner but before the retraining was recorded:
    # the resume retrains the planned architecture and trains no supernet again.
    from rankitect.search.running.checkpoint import load_state, save_state

    state_path = Path(client.get_run(parent).data.tags["rankitect.checkpoint"])
    state = load_state(state_path)
    assert [Architecture.from_dict(d).hash for d in state.plan] == [candidate.data.tags["genotype_hash"]]
    client.delete_run(candidate.info.run_id)
    state.trials = [t for t in state.trials if t.kind != "candidate"]
    state.done = False
    save_state(state_path, state)

    def no_supernet(*args: object, **kwargs: object) -> None:
        raise AssertionError("a resumed search with a plan must not train a supernet")

    monkeypatch.setattr("rankitect.search.proposing.plan_proposer.build_supernet", no_supernet)
    assert main(["search", "--resume", parent]) == 0
    runs = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'")
    retrained = [r for r in runs if r.data.tags["rankitect.kind"] == "candidate"]
    assert [r.data.tags["genotype_hash"] for r in retrained] == [candidate.data.tags["genotype_hash"]]


def test_dnas_takes_the_baselines_its_space_holds() -> None:
    from rankitect.eval.result import TrialResult
    from rankitect.search.strategies.dnas import DnasSearch
    from rankitect.space.baselines import get_baseline

    space = three_slots()
    inside = space.decode(space.sample(np.random.default_rng(1)))
    strategy = DnasSearch(space, seed=0, objective=Objective())
    assert strategy.observe(inside, TrialResult(val_ne=0.8, mflops=1.0))
    assert not strategy.observe(inside, TrialResult(val_ne=0.8, mflops=1.0, status="failed"))
    outside = get_baseline("wukong", tiny_spec())
    assert space.encode(outside) is None and not strategy.observe(outside, TrialResult(val_ne=0.7, mflops=1.0))


class _NoTracker:
    """The tracker calls of a supernet phase, recorded nowhere."""

    def start_child_run(self, *args, **kwargs) -> str:
        return "supernet"

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def test_dnas_supernet_trains_as_many_epochs_as_the_baselines_took(data: ClickData, monkeypatch) -> None:
    """``epochs: auto`` (the default): every trained baseline, in the space or not, tells how many
    epochs models took to their best validation here; the supernet's schedule is their median."""
    from rankitect.eval.result import TrialResult
    from rankitect.search.base import SearchContext
    from rankitect.search.strategies.dnas import DnasSearch
    from rankitect.space.baselines import get_baseline

    space = three_slots()
    per_epoch = len(data.split("train")) // TRAIN.batch_size  # whole batches: the rows left over join the last
    config = DnasConfig(supernet=SupernetConfig(steps=10**6, epochs="auto"))
    strategy = DnasSearch(space, seed=0, objective=Objective(), config=config)
    inside = space.decode(space.sample(np.random.default_rng(1)))
    strategy.observe(inside, TrialResult(val_ne=0.8, mflops=1.0, best_step=2 * per_epoch))
    strategy.observe(get_baseline("wukong", data.spec), TrialResult(val_ne=0.7, mflops=1.0, best_step=6 * per_epoch))
    strategy.observe(inside, TrialResult(status="failed", best_step=90 * per_epoch))  # failed: not counted
    strategy.observe(get_baseline("dlrm", data.spec), TrialResult(val_ne=0.9, mflops=1.0, best_step=3 * per_epoch))
    seen = {}

    def fake_search(supernet, data, train_cfg, cfg, objective, **kw):
        seen["schedule"] = dnas_schedule(cfg, len(data.split("train")), train_cfg.batch_size)
        return ArchitectureWeights(space)

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", fake_search)
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=lambda line: None)
    strategy.search(context)
    assert seen["schedule"][0] == 3 * per_epoch  # median of 2, 6 and 3 epochs


def _preferred_change(space, weights: ArchitectureWeights, origin: Architecture, skip: set[str],
                      keep=lambda arch: True) -> Architecture:
    """By hand: over every one-choice change of ``origin`` (labels it does not read at their most
    probable option) that ``keep`` accepts, the one whose option gains most probability over the
    option it replaces."""
    probs = {label: np.exp(a.detach().numpy()) / np.exp(a.detach().numpy()).sum()
             for label, a in zip(weights.labels, weights.logits)}
    path = space.encode(origin)
    base = dict(path)
    for label, c in space.choices.items():
        if label not in space.active(path):
            base[label] = c.options[int(np.argmax(probs[label]))]
    best, gain = None, -np.inf
    for label in space.active(base):
        here = space.choices[label].index(base[label])
        for i, option in enumerate(space.choices[label].options):
            arch = space.decode({**base, label: option})
            g = np.log(probs[label][i]) - np.log(probs[label][here])
            if i != here and arch.hash not in skip and arch.hash != origin.hash and g > gain and keep(arch):
                best, gain = arch, g
    return best


def _first_change(space, weights: ArchitectureWeights, origins: list[Architecture], skip: set[str],
                  keep=lambda arch, origin: True) -> Architecture | None:
    """By hand: :func:`_preferred_change` of the first of ``origins`` (best first) that has one
    ``keep`` accepts (``keep`` sees the change and its origin)."""
    for origin in origins:
        found = _preferred_change(space, weights, origin, skip, keep=lambda arch, o=origin: keep(arch, o))
        if found is not None:
            return found
    return None


def test_with_a_budget_dnas_goes_on_around_the_best_architecture_retrained(data: ClickData, monkeypatch) -> None:
    """Past its ``top_k``, a search with a time budget asks the most preferred untried change of the
    best architecture trained so far: a baseline while it is best, then the change that beat it;
    every other change is the most preferred one that costs less than its origin."""
    from rankitect.eval.result import TrialResult
    from rankitect.search.base import SearchContext, SpaceExhausted
    from rankitect.search.strategies.dnas import DnasSearch

    space = three_slots()
    rng = np.random.default_rng(3)
    weights = ArchitectureWeights(space)
    with torch.no_grad():
        for a in weights.logits:
            a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))))
    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=lambda line: None)

    def searched(fill: int) -> tuple[DnasSearch, Architecture]:
        strategy = DnasSearch(space, seed=0, objective=Objective(), fill=fill)
        baseline = space.decode(space.sample(np.random.default_rng(1)))
        strategy.observe(baseline, TrialResult(val_ne=0.8, mflops=1.0))
        strategy.start(context)
        return strategy, baseline

    strategy, baseline = searched(fill=0)
    argmax = strategy.ask()
    assert argmax == space.decode(weights.argmax())
    strategy.tell(argmax, TrialResult(val_ne=0.9, mflops=1.0))
    with pytest.raises(SpaceExhausted):  # no budget: the top_k most probable only
        strategy.ask()

    def mflops(arch: Architecture) -> float:  # the analytic count the search compares costs by
        return cost(arch, data.spec).flops / 1e6

    def simpler(arch: Architecture, origin: Architecture) -> bool:
        return mflops(arch) < mflops(origin)

    strategy, baseline = searched(fill=10)
    assert strategy.ask() == argmax and not strategy.prunable  # what the supernet chose is trained in full
    strategy.tell(argmax, TrialResult(val_ne=0.9, mflops=1.0))  # worse than the baseline
    seen = {baseline.hash, argmax.hash}
    first = strategy.ask()
    assert first == _preferred_change(space, weights, baseline, seen) and strategy.prunable  # a change may be pruned
    seen.add(first.hash)
    strategy.tell(first, TrialResult(val_ne=0.7, mflops=1.0))  # beats the baseline: the search moves
    second = strategy.ask()  # every other change a simplification, here of first
    assert second == _first_change(space, weights, [first, baseline, argmax], seen, keep=simpler)
    assert mflops(second) < mflops(first) and strategy.prunable
    seen.add(second.hash)
    strategy.tell(second, TrialResult(val_ne=0.75, mflops=1.0))  # worse than first: first stays the origin
    state = json.loads(json.dumps(strategy.state_dict()))  # the checkpoint is JSON
    third = strategy.ask()
    assert third == _preferred_change(space, weights, first, seen)

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: pytest.fail("searched again"))
    resumed = DnasSearch(space, seed=0, objective=Objective(), fill=10)
    resumed.load_state_dict(state)
    resumed.start(replace(context, finished={argmax.hash, first.hash, second.hash}))
    assert resumed.ask() == third  # no supernet again, nothing finished proposed again


def test_with_a_flops_target_every_other_change_costs_no_more_than_the_target(data: ClickData,
                                                                           monkeypatch) -> None:
    """With ``target_mflops`` the changes alternate: any change of the best architecture by objective
    (here one above the target), then the most preferred simplification (cheaper than its origin,
    within the target) of the best architecture that has one, although the change the weights
    prefer most costs more."""
    from rankitect.eval.result import TrialResult
    from rankitect.search.base import SearchContext
    from rankitect.search.strategies.dnas import DnasSearch

    space = three_slots()

    def mflops(arch: Architecture) -> float:  # the analytic count trials are ranked by
        return cost(arch, data.spec).flops / 1e6

    baseline = space.decode(space.sample(np.random.default_rng(1)))
    target = mflops(baseline)

    def within(arch: Architecture) -> bool:
        return mflops(arch) <= target

    rng = np.random.default_rng(5)
    samples = [space.decode(space.sample(rng)) for _ in range(1000)]
    for seed in range(100):  # weights under which the best's preferred change costs more than the target
        weights = ArchitectureWeights(space)
        with torch.no_grad():
            for i, a in enumerate(weights.logits):
                a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(1000 * seed + i)))
        argmax = space.decode(weights.argmax())
        skip = {baseline.hash, argmax.hash}
        big = next((a for a in samples if mflops(a) > target and a.hash not in skip
                    and not within(_preferred_change(space, weights, a, skip))
                    and _preferred_change(space, weights, a, skip, keep=within) is not None), None)
        if argmax != baseline and big is not None:
            break
    else:
        pytest.fail("no weights and architecture whose preferred change costs more than the target")
    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=lambda line: None)
    objective = Objective(target_mflops=target)
    strategy = DnasSearch(space, seed=0, objective=objective, fill=10)
    strategy.observe(baseline, TrialResult(val_ne=0.8, mflops=target))
    strategy.observe(big, TrialResult(val_ne=0.5, mflops=mflops(big)))  # the best by objective, above the target
    strategy.start(context)
    assert strategy.ask() == argmax
    strategy.tell(argmax, TrialResult(val_ne=0.95, mflops=mflops(argmax)))  # worse than both
    seen = {baseline.hash, big.hash, argmax.hash}

    first = strategy.ask()
    assert first == _preferred_change(space, weights, big, seen) and not within(first)
    seen.add(first.hash)
    second = strategy.ask()
    assert second == _preferred_change(space, weights, big, seen, keep=within)  # cheaper than its origin
    assert within(second) and strategy.prunable
    seen.add(second.hash)
    strategy.tell(first, TrialResult(val_ne=0.9, mflops=mflops(first)))
    strategy.tell(second, TrialResult(val_ne=0.45, mflops=mflops(second)))  # the best now, within the target
    state = json.loads(json.dumps(strategy.state_dict()))
    third, fourth = strategy.ask(), strategy.ask()
    assert third == _preferred_change(space, weights, second, seen)
    val_ne = {second: 0.45, big: 0.5, baseline: 0.8, first: 0.9, argmax: 0.95}  # as told above
    ranked = sorted(val_ne, key=lambda arch: objective.value(val_ne[arch], mflops(arch)))  # origins, best first
    expected = _first_change(space, weights, ranked, seen | {third.hash},
                             keep=lambda arch, origin: mflops(arch) < mflops(origin) and within(arch))
    assert fourth == expected and within(fourth)  # a simplification below the target

    resumed = DnasSearch(space, seed=0, objective=objective, fill=10)
    resumed.load_state_dict(state)
    resumed.start(replace(context, finished=seen))
    assert (resumed.ask(), resumed.ask()) == (third, fourth)  # the turns go on where they were


def test_once_the_climb_stalls_samples_and_shakes_take_turns_with_changes(data: ClickData, monkeypatch) -> None:
    """After ``patience`` proposals told without a new best by objective, every other proposal is a
    uniform sample of the whole space within the FLOPs target (the first untried one drawn, without a
    surrogate), and of the others, every other one a change as before and every other one a shake: a
    ``k``-choice change of the best within the target (the first untried one drawn), ``k`` = 2, then 3
    after a shake that finds no new best. A shake (or sample) that becomes the best ends them and is
    the next origin. The turns survive a resume; ``patience: 0`` never leaves the climb."""
    from rankitect.eval.result import TrialResult
    from rankitect.search.base import SearchContext
    from rankitect.search.strategies.dnas import DnasSearch

    space = three_slots()

    def mflops(arch: Architecture) -> float:
        return cost(arch, data.spec).flops / 1e6

    baseline = space.decode(space.sample(np.random.default_rng(1)))
    target = mflops(baseline)
    weights = ArchitectureWeights(space)
    with torch.no_grad():
        for i, a in enumerate(weights.logits):
            a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(i)))
    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    said: list[str] = []
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=said.append)
    objective = Objective(target_mflops=target)

    def searched(patience: int) -> DnasSearch:
        strategy = DnasSearch(space, seed=7, objective=objective, fill=20, config=DnasConfig(patience=patience))
        strategy.observe(baseline, TrialResult(val_ne=0.8, mflops=target))
        strategy.start(context)
        return strategy

    rng = np.random.default_rng(7)  # by hand: the strategy's draws, from its seed, in its order

    def first_shake(k: int, seen: set[str]) -> Architecture:
        while True:
            arch = space.mutate(baseline, rng, k)
            if arch.hash not in seen and within(arch):
                return arch

    def first_sample(seen: set[str]) -> Architecture:
        while True:
            arch = space.decode(space.sample(rng))
            if arch.hash not in seen and within(arch):
                return arch

    def worse(arch: Architecture) -> TrialResult:
        return TrialResult(val_ne=0.9, mflops=mflops(arch))

    def within(arch: Architecture) -> bool:
        return mflops(arch) <= target * (1 + 1e-9)

    def simpler(arch: Architecture) -> bool:  # than the baseline, the origin while nothing beats it
        return mflops(arch) < target

    def changes_of_baseline(seen: set[str]) -> list[Architecture]:
        return [_preferred_change(space, weights, baseline, seen),
                _preferred_change(space, weights, baseline, seen, keep=simpler)]

    strategy = searched(patience=2)
    argmax = strategy.ask()
    strategy.tell(argmax, worse(argmax))
    seen = {baseline.hash, argmax.hash}

    def next_turn() -> Architecture:
        arch = strategy.ask()
        assert strategy.prunable and arch.hash not in seen
        seen.add(arch.hash)
        return arch

    for _ in range(2):  # two proposals without a new best: patience reached
        change = next_turn()
        strategy.tell(change, worse(change))
    sample = strategy.ask()
    assert sample == first_sample(seen) and within(sample) and "a sample of the space" in said[-1]
    assert sample not in changes_of_baseline(seen)
    seen.add(sample.hash)
    strategy.tell(sample, worse(sample))
    third = next_turn()  # still stalled: a change takes the next turn, any change after a simplification
    assert third == _preferred_change(space, weights, baseline, seen - {third.hash})
    strategy.tell(third, worse(third))
    state, told_then = json.loads(json.dumps(strategy.state_dict())), set(seen)
    second_sample = strategy.ask()
    assert second_sample == first_sample(seen) and "a sample of the space" in said[-1]
    seen.add(second_sample.hash)
    strategy.tell(second_sample, worse(second_sample))
    shake = strategy.ask()  # the next change's turn is a shake: a 2-choice change of the best
    assert shake == first_shake(2, seen) and within(shake) and f"a 2-choice change of {baseline.hash}" in said[-1]
    seen.add(shake.hash)
    strategy.tell(shake, worse(shake))
    for expected in ("a sample of the space", "a change of", "a sample of the space"):
        before = set(seen)
        arch = next_turn()
        assert expected in said[-1] and (expected == "a change of" or arch == first_sample(before))
        strategy.tell(arch, worse(arch))
    wider = strategy.ask()  # a shake again, one choice wider: the first found no new best
    assert wider == first_shake(3, seen) and f"a 3-choice change of {baseline.hash}" in said[-1]
    seen.add(wider.hash)
    strategy.tell(wider, TrialResult(val_ne=0.5, mflops=mflops(wider)))  # the new best
    after = strategy.ask()  # the climb goes on from it, and no sample or shake follows
    assert f"a change of {wider.hash}" in said[-1] and after in [
        _preferred_change(space, weights, wider, seen),
        _preferred_change(space, weights, wider, seen, keep=lambda arch: mflops(arch) < mflops(wider) and within(arch))]
    seen.add(after.hash)
    strategy.tell(after, worse(after))
    for expected in ("a change of", "a sample of the space", "a change of", "a sample of the space",
                     f"a 2-choice change of {wider.hash}"):  # stalled again: the turns start over
        before = set(seen)
        arch = next_turn()
        assert expected in said[-1] and (expected != "a sample of the space" or arch == first_sample(before))
        strategy.tell(arch, worse(arch))

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: pytest.fail("searched again"))
    resumed = DnasSearch(space, seed=7, objective=objective, fill=20, config=DnasConfig(patience=2))
    resumed.load_state_dict(state)
    resumed.start(replace(context, finished=told_then))
    assert resumed.ask() == second_sample  # a sample's turn, drawn as it was

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    never = searched(patience=0)
    told = {baseline.hash}
    for _ in range(8):
        arch = never.ask()
        origin_changes = {_preferred_change(space, weights, baseline, told),
                          _preferred_change(space, weights, baseline, told, keep=simpler)}
        assert arch in origin_changes or arch == argmax  # changes of the baseline only
        told.add(arch.hash)
        never.tell(arch, worse(arch))
