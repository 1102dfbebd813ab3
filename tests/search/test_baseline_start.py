"""Searches start from the trained baselines: strategies observe them, ``auto`` targets resolve after
them, and a baseline may win."""

from __future__ import annotations

import math

import pytest

from rankitect.config import load_config
from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from rankitect.search import _optuna
from rankitect.search.running.shared_study import takes_budget
from rankitect.eval.objective import Objective
from rankitect.search.running.runner import SearchRunner
from rankitect.search.judging.selection import Entrant, Pick
from rankitect.space import get_space
from rankitect.space.baselines import BASELINES, engineer_space_for, get_baseline
from rankitect.space.testing import tiny_spec
from tests.learnable import learnable_source

SPEC = tiny_spec()
OPTIONS = {"random": {}, "evolution": {"population": 6, "sample_size": 6}, "tpe": {"n_startup_trials": 2},
           "nsga2": {"population_size": 4}}


def trained_baselines() -> list[tuple[str, object, TrialResult]]:
    """The six baselines with made-up results; dcnv2 has the lowest validation NE."""
    out = []
    for i, name in enumerate(BASELINES):
        ne = 0.70 if name == "dcnv2" else 0.80 + 0.01 * i
        out.append((name, get_baseline(name, SPEC), TrialResult(val_ne=ne, test_ne=ne, mflops=1.0 + i)))
    return out


@pytest.mark.parametrize("name", list(OPTIONS))
def test_strategies_take_baselines_once_and_never_propose_them(name):
    space = engineer_space_for(SPEC)
    strategy = build_strategy(name, space, seed=0, **OPTIONS[name])
    bases = trained_baselines()
    assert all(strategy.observe(arch, r) for _, arch, r in bases)
    assert not any(strategy.observe(arch, r) for _, arch, r in bases)  # idempotent (e.g. on resume)
    restored = build_strategy(name, space, seed=0, **OPTIONS[name])
    restored.load_state_dict(strategy.state_dict())
    assert not restored.observe(*bases[0][1:])  # the checkpoint holds them
    base_hashes = {arch.hash for _, arch, _ in bases}
    for _ in range(6):
        arch = strategy.ask()
        assert arch.hash not in base_hashes
        strategy.tell(arch, TrialResult(val_ne=0.9, mflops=1.0))


def test_a_baseline_outside_the_space_is_not_taken():
    strategy = build_strategy("evolution", get_space("nasrec"), seed=0)
    assert not strategy.observe(get_baseline("dlrm", SPEC), TrialResult(val_ne=0.8, mflops=1.0))


def test_evolution_mutates_the_best_baseline_first(monkeypatch):
    space = engineer_space_for(SPEC)
    strategy = build_strategy("evolution", space, seed=0, **OPTIONS["evolution"])  # tournament = everyone
    for _, arch, r in trained_baselines():
        strategy.observe(arch, r)
    parents = []
    mutate = space.mutate
    monkeypatch.setattr(space, "mutate", lambda arch, rng, num_mutations=1: parents.append(arch) or
                        mutate(arch, rng, num_mutations))
    strategy.ask()
    assert parents and parents[0] == get_baseline("dcnv2", SPEC)


@pytest.mark.parametrize("name", ["tpe", "nsga2"])
def test_optuna_studies_hold_baselines_as_finished_trials_outside_the_budget(name):
    strategy = build_strategy(name, engineer_space_for(SPEC), seed=0, objective=Objective(target_mflops=2.0))
    _, arch, result = trained_baselines()[1]
    strategy.observe(arch, result)
    (trial,) = strategy.study.get_trials()
    assert trial.state.name == "COMPLETE" and trial.user_attrs[_optuna.HASH_ATTR] == arch.hash
    assert _optuna.counts(trial) and not takes_budget(trial)
    expected = [Objective(target_mflops=2.0)(result)] if name == "tpe" else [result.val_ne, result.mflops]
    assert trial.values == pytest.approx(expected)
    assert strategy.space.decode(trial.params) == arch


TINY = ["train.max_epochs=1", "train.batch_size=64", "train.val_batches=2", "train.test_batches=2",
        "search.evolution.population=2", "search.evolution.sample_size=2", "runtime.threads=1", "search.workers=1", "search.trials=2",
        "search.baselines=[dlrm,deepfm]"]


def test_auto_target_resolves_to_the_best_baseline_and_baselines_compete(tmp_path, monkeypatch):
    """With ``min_gain_se=0`` (the plain rule): the target is the FLOPs of the best baseline by
    validation NE and the lowest objective wins; the paired rule is tested in ``test_selection.py``."""
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(overrides=[f"data.source={learnable_source()}", *TINY, "search.min_gain_se=0"])
    assert cfg.search.target_mflops == "auto"
    lines: list[str] = []
    runner = SearchRunner(cfg, echo=lines.append)
    assert runner.standings.objective.target_mflops is None  # nothing to resolve it from before the baselines
    outcome = runner.run()
    table = outcome.table
    bases = table[(table["kind"] == "baseline") & (table["status"] == "ok")]
    best = bases.loc[bases["val_ne"].idxmin()]
    assert runner.standings.objective.target_mflops == pytest.approx(best["mflops"])
    assert any(line.startswith("target_mflops auto: ") and best["name"] in line for line in lines)
    ok = table[table["status"] == "ok"]
    for _, row in ok.iterrows():  # every row ranked by the resolved objective, NE in its own units
        doublings = max(0.0, math.log2(row["mflops"] / best["mflops"]))
        assert row["objective"] == pytest.approx(row["val_ne"] * (1 + 0.01 * doublings))
    assert table.loc[table["winner"], "objective"].item() == ok["objective"].min()
    # the best baseline pays no penalty at its own FLOPs, so the winner is never worse on validation
    assert table.loc[table["winner"], "val_ne"].item() <= best["val_ne"]
    finished = {h for h, _, _ in runner.state.strategy["history"]["finished"]}
    trials = runner.recorder.all_trials()
    assert {get_baseline(n, runner.data.spec).hash for n in ("dlrm", "deepfm")} <= finished
    for cap in sorted(set(ok["mflops"])):  # under a cost cap: the lowest objective of what fits, by hand
        fits = ok[ok["mflops"] <= cap]
        won = runner.standings.winner_within(trials, cap).winner.result
        assert won.mflops <= cap
        doublings = max(0.0, math.log2(won.mflops / best["mflops"]))
        assert won.val_ne * (1 + 0.01 * doublings) == pytest.approx(fits["objective"].min())
    assert runner.standings.winner_within(trials, 0.5 * ok["mflops"].min()) is None
    capped = [line for line in lines if line.startswith("at no more than target_mflops")]
    if table.loc[table["winner"], "mflops"].item() > best["mflops"]:  # the output names the pick under the cap too
        assert len(capped) == 1 and runner.standings.winner_within(trials, best["mflops"]).winner.name in capped[0]
    else:
        assert not capped
    # a winner above a target: the line names the pick under the cap; at or below it, no line
    cheapest, dearest = (ok.loc[i] for i in (ok["mflops"].idxmin(), ok["mflops"].idxmax()))
    runner.standings.objective = runner.standings.objective.with_target(float(cheapest["mflops"]))
    line = runner.standings.within_target(trials, Pick(Entrant(dearest["name"], dearest["kind"], TrialResult(
        val_ne=dearest["val_ne"], mflops=dearest["mflops"]))))
    assert line.startswith(f"at no more than target_mflops ({cheapest['mflops']:.4f} MFLOPs): ")
    assert runner.standings.winner_within(trials, float(cheapest["mflops"])).winner.name in line
    assert runner.standings.within_target(trials, Pick(Entrant(cheapest["name"], cheapest["kind"], TrialResult(
        val_ne=cheapest["val_ne"], mflops=cheapest["mflops"])))) is None
