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
    monkeypatch.setattr("rankitect.search.sizing.get_space", lambda name, **kw: get_space(
        name, **{**SMALL_NASREC, "num_blocks": 2}))
    code = main(["search", "--strategy", "dnas", "--target-mflops", "0.01", f"data.source={learnable_source()}",
                 "search.trials=1", "train.max_epochs=1", "search.space=nasrec", "search.flops_range=null",
                 "train.batch_size=64", "train.val_batches=2", "train.test_batches=2",
                 "train.progress=false", "search.dnas.supernet.steps=12", "search.dnas.weights_only_steps=4",
                 "search.dnas.supernet.log_every=4", "search.baselines=[dlrm]", "runtime.threads=1"])
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
                 "train.test_batches=2", "train.progress=false", "runtime.threads=1"])
    assert code == 0
    new = capsys.readouterr().out.split("MLflow run: ")[1].split()[0]
    assert client.get_run(new).data.tags["rankitect.start"] == "supernet"

    # Killed after the supernet phase chose its winner but before the retraining was recorded:
    # the resume retrains the planned architecture and trains no supernet again.
    from rankitect.search.checkpoint import load_state, save_state

    state_path = Path(client.get_run(parent).data.tags["rankitect.checkpoint"])
    state = load_state(state_path)
    assert [Architecture.from_dict(d).hash for d in state.plan] == [candidate.data.tags["genotype_hash"]]
    client.delete_run(candidate.info.run_id)
    state.trials = [t for t in state.trials if t.kind != "candidate"]
    state.done = False
    save_state(state_path, state)

    def no_supernet(*args: object, **kwargs: object) -> None:
        raise AssertionError("a resumed search with a plan must not train a supernet")

    monkeypatch.setattr("rankitect.search.plan_proposer.build_supernet", no_supernet)
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


def _beta_max_probabilities(params: list[tuple[int, int]], grid: int = 200_001) -> list[float]:
    """By hand: for independent ``Beta(a, b)`` draws, the probability that each is the largest,
    ``P_i = integral of f_i(x) * prod_j!=i F_j(x) dx``, on a grid of ``[0, 1]`` (pdfs from the
    textbook formula, cdfs by the trapezoid rule)."""
    import math

    x = np.linspace(0.0, 1.0, grid)
    inner = x[1:-1]
    pdfs = []
    for a, b in params:
        log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        f = np.zeros_like(x)
        f[1:-1] = np.exp(log_norm + (a - 1) * np.log(inner) + (b - 1) * np.log1p(-inner))
        f[0], f[-1] = (1.0 if a == 1 else 0.0) * b, (1.0 if b == 1 else 0.0) * a
        pdfs.append(f)
    dx = x[1] - x[0]
    cdfs = [np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2 * dx)]) for f in pdfs]
    out = []
    for i, f in enumerate(pdfs):
        g = f * np.prod([c for j, c in enumerate(cdfs) if j != i], axis=0)
        out.append(float(np.sum((g[1:] + g[:-1]) / 2 * dx)))
    return out


def test_thompson_picks_each_key_with_the_probability_its_rate_of_kept_proposals_is_highest() -> None:
    """Each key is chosen as often as its ``Beta(1 + kept, 1 + told - kept)`` draw is the largest:
    the probabilities integrated by hand, against 20,000 choices."""
    from rankitect.search.strategies.dnas import thompson

    for record in ({"sample": [2, 12], "local": [10, 20]},
                   {"sample": [0, 0], "local": [0, 0]},
                   {"sample": [5, 6], "local": [11, 30]},
                   {"change": [3, 20], "shake": [2, 5], "sample": [0, 12]}):
        rng = np.random.default_rng(0)
        picks = [thompson(record, rng) for _ in range(20_000)]
        expected = _beta_max_probabilities([(1 + kept, 1 + told - kept) for kept, told in record.values()])
        assert sum(expected) == pytest.approx(1.0, abs=1e-4)
        for key, p in zip(record, expected):
            assert picks.count(key) / len(picks) == pytest.approx(p, abs=0.012), (record, key)


@pytest.mark.parametrize("kept", ["sample", "local", None])
def test_once_the_climb_stalls_samples_take_turns_as_often_as_they_are_kept(data: ClickData, monkeypatch,
                                                                            kept: str | None) -> None:
    """After ``patience`` proposals told without a new best by objective, each proposal is a sample
    of the whole space within the FLOPs target or a local move (by turns a change as before and a
    shake: a ``k``-choice change of the best within the target, ``k`` = 2, 3, ... within a stall),
    samples about as often as local moves while both are kept as often (None: every other proposal
    of each is kept), and mostly the one that is kept where the other is pruned (``kept``). A new best ends the stall, is
    the next origin, and the local moves start again with a change and a 2-choice shake. What was
    kept is said and survives a resume; ``patience: 0`` never leaves the climb."""
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
        strategy = DnasSearch(space, seed=7, objective=objective, fill=200, config=DnasConfig(patience=patience))
        strategy.observe(baseline, TrialResult(val_ne=0.8, mflops=target))
        strategy.start(context)
        return strategy

    def within(arch: Architecture) -> bool:
        return mflops(arch) <= target * (1 + 1e-9)

    strategy = searched(patience=2)
    argmax = strategy.ask()
    seen, best, best_ne = {baseline.hash, argmax.hash}, baseline, 0.8
    strategy.tell(argmax, TrialResult(val_ne=0.9, mflops=mflops(argmax)))
    record = {"sample": [0, 0], "local": [0, 0]}  # by hand, from what was said
    stalled: list[str] = []  # sample or local, of each proposal made while stalled
    locals_: list[str] = []  # what each local move was in the current stall: change, or the width of a shake
    told_since_best, state = 0, None  # the supernet's choice is the first told: the count starts after it
    for turn in range(60):
        if turn == 30:
            state, told_then = json.loads(json.dumps(strategy.state_dict())), set(seen)
        arch = strategy.ask()
        next_arch = arch if turn == 30 else next_arch if turn > 30 else None
        assert strategy.prunable and arch.hash not in seen
        seen.add(arch.hash)
        line = said[-1]
        what = ("sample" if "a sample of the space" in line else "shake" if "-choice change of" in line
                else "change" if "a change of" in line else pytest.fail(line))
        reach = "sample" if what == "sample" else "local"
        if told_since_best >= 2:
            stalled.append(reach)
            if what != "sample":
                locals_.append("change" if what == "change" else line.split("-choice change of ")[0].split("(a ")[-1])
                # by turns: change, shake 2, change, shake 3, ... (a shake with nothing left gives way to a change)
                assert locals_[-1] in ("change", str(2 + (len(locals_) - 1) // 2) if len(locals_) % 2 == 0 else "")
        else:
            assert what == "change", "a climb that has not stalled proposes changes only"
        if what == "shake":
            assert f"-choice change of {best.hash}" in line and within(arch) and arch != best
        if what == "sample":
            assert within(arch)
        if what != "change":
            assert (f"{told_since_best} proposals told without a new best; kept, not pruned: samples "
                    f"{record['sample'][0]} of {record['sample'][1]}, changes and shakes "
                    f"{record['local'][0]} of {record['local'][1]}") in line
        if turn % 12 == 11:  # now and then a new best, whatever it is
            result = TrialResult(val_ne=best_ne - 0.01, mflops=mflops(arch))
        elif reach == kept or kept is None and record[reach][1] % 2 == 0:
            result = TrialResult(val_ne=0.9, mflops=mflops(arch))
        else:
            result = TrialResult.pruning("below the rung", val_ne=0.95, mflops=mflops(arch), params=None,
                                         train_seconds=1.0, steps=10)
        strategy.tell(arch, result)
        record[reach][0] += result.ok
        record[reach][1] += 1
        if result.ok and result.val_ne < best_ne:
            best, best_ne, told_since_best, locals_ = arch, result.val_ne, 0, []
        else:
            told_since_best += 1
    assert strategy.state_dict()["record"] == record
    last = stalled[len(stalled) // 2:]
    assert "sample" in stalled and "local" in stalled, "both are tried"
    if kept is None:
        assert 0.3 <= stalled.count("sample") / len(stalled) <= 0.7, stalled
    else:
        assert last.count(kept) >= 0.8 * len(last), stalled
    assert record["local"][1] > 0 and any(k not in ("change", "") for k in locals_ or ["2"])

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: pytest.fail("searched again"))
    resumed = DnasSearch(space, seed=7, objective=objective, fill=200, config=DnasConfig(patience=2))
    resumed.load_state_dict(state)
    resumed.start(replace(context, finished=told_then))
    assert resumed.ask() == next_arch  # the same turn, drawn as it was

    older = dict(state, stall=[state["stall"][0], 3, 7])  # a state from before the record: its turns since the stall
    del older["record"]
    resumed = DnasSearch(space, seed=7, objective=objective, fill=200, config=DnasConfig(patience=2))
    resumed.load_state_dict(older)
    assert resumed.state_dict()["stall"][1:] == [3, 3]  # turns 1, 3 and 5 of the old cycle were local moves
    assert resumed.state_dict()["record"] == {"sample": [0, 0], "local": [0, 0]}

    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    never = searched(patience=0)
    told = {baseline.hash}

    def simpler(arch: Architecture) -> bool:  # than the baseline, the origin while nothing beats it
        return mflops(arch) < target

    for _ in range(8):
        arch = never.ask()
        origin_changes = {_preferred_change(space, weights, baseline, told),
                          _preferred_change(space, weights, baseline, told, keep=simpler)}
        assert arch in origin_changes or arch == argmax  # changes of the baseline only
        told.add(arch.hash)
        never.tell(arch, TrialResult(val_ne=0.9, mflops=mflops(arch)))
