"""Multi-fidelity search: the successive-halving rule against a naive reference, pruned trials in
the runner (own MLflow status, partial curve kept, budget slot reused), and the time budget."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import rankitect.train.protocol as protocol
from rankitect.config import load_config
from rankitect.errors import ConfigError
from rankitect.eval.result import TrialResult
from rankitect.search.running.budget import parse_duration
from rankitect.search.judging.pruning import Rungs, first_rung, pruned_early
from rankitect.search.running.runner import SearchRunner
from rankitect.train.task import TrialPruned

from tests.learnable import learnable_source
from tests.planted import Scored

TINY = [
    f"data.source={learnable_source()}", "train.batch_size=64", "train.max_epochs=3", "train.test_batches=2",
    "search.strategy=random", "runtime.threads=1", "search.workers=1",
]


def _naive_keeps(value: float, at_rung: list[float], reduction: int) -> bool:
    """Successive halving, written out: keep a trial whose value is among the best
    ``len // reduction`` of every value that reached the rung (itself included), or the best when
    fewer than ``reduction`` did."""
    ranked = sorted(at_rung)
    k = max(len(ranked) // reduction, 1)
    return value <= ranked[k - 1]


def test_rung_rule_matches_the_textbook(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations=1)
    base = rungs.ticket("baseline", prune=False).reporter()
    base(1, 0.8)  # a baseline's rung value counts for every later trial
    seen = [0.8]
    for i in range(25):
        value = float(rng.uniform(0.6, 1.0))
        ticket = rungs.ticket(f"c{i}")
        reporter = ticket.reporter()
        seen.append(value)
        keep = _naive_keeps(value, seen, 3)
        try:
            reporter(1, value)
            kept = True
        except TrialPruned:
            kept = False
        assert kept == keep, (i, value, sorted(seen))
        rungs.close(ticket, TrialResult.pruning("x", val_ne=value, mflops=1.0, params=1, train_seconds=0.0, steps=1)
                    if not kept else TrialResult(val_ne=value, mflops=1.0))


def test_rungs_are_at_min_times_reduction_powers(tmp_path: Path) -> None:
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=2, min_validations=2)
    best = rungs.ticket("best", prune=False).reporter()
    for k in range(1, 9):
        best(k, 0.5)
    worse = rungs.ticket("worse").reporter()
    worse(1, 0.9)  # before the first rung (2 validations): never pruned
    with pytest.raises(TrialPruned, match="after validation 2"):
        worse(2, 0.9)
    last = rungs.ticket("last").reporter()
    last(1, 0.9)
    last(2, 0.9, True)  # a final validation is recorded at its rung but never pruned


def _probed_baselines(rungs: Rungs, probes: list[float]) -> None:
    """Six finished baselines: baseline ``b`` reports its probe ``probes[b]``, then 0.5 + 0.01 b at
    three validations (baseline 0 is the best and leads every rung)."""
    for b, probe in enumerate(probes):
        ticket = rungs.ticket(f"base{b}", prune=False)
        assert ticket.probe  # baselines probe unless the probe is off
        reporter = ticket.reporter()
        reporter(0, probe)  # a baseline is never stopped, at the probe or anywhere
        for k in (1, 2, 3):
            reporter(k, 0.5 + 0.01 * b, k == 3)
        rungs.close(ticket, TrialResult(val_ne=0.5 + 0.01 * b, mflops=1.0))


def test_early_rung_auto_judges_at_the_probe_by_the_textbook_rule_where_it_keeps_the_best(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    probes = [0.71, 0.70, 0.75, 0.76, 0.77, 0.78]  # the best baseline's probe is second of six: kept
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations="auto", early="auto")
    _probed_baselines(rungs, probes)
    assert rungs.calibrate() == (1, "base0") and rungs.early == 0 and "keeps the best, base0" in rungs.early_note
    seen, outcomes = list(probes), set()
    for i in range(20):
        value = float(rng.uniform(0.65, 0.85))
        ticket = rungs.ticket(f"c{i}")
        assert ticket.probe and ticket.early == 0
        seen.append(value)
        try:
            ticket.reporter()(0, value)
            kept = True
        except TrialPruned as e:
            kept = False
            assert pruned_early(TrialResult.pruning(str(e), val_ne=value, mflops=1.0, params=1,
                                                       train_seconds=0.0, steps=1))
        assert kept == _naive_keeps(value, seen, 3), (i, value, sorted(seen))
        outcomes.add(kept)
        rungs.close(ticket, TrialResult(val_ne=value, mflops=1.0) if kept else
                    TrialResult.pruning("x", val_ne=value, mflops=1.0, params=1, train_seconds=0.0, steps=1))
    assert outcomes == {True, False}


def test_early_rung_auto_stays_off_where_it_would_stop_the_best(tmp_path: Path) -> None:
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations="auto", early="auto")
    _probed_baselines(rungs, [0.74, 0.70, 0.71, 0.76, 0.77, 0.78])  # the best is third of six at its probe
    rungs.calibrate()
    assert rungs.early is None and "would stop the best, base0" in rungs.early_note
    ticket = rungs.ticket("c")
    assert not ticket.probe and ticket.early == -1 and ticket.reporter().probe == 0  # no probe validation for it
    off = Rungs(None, None, tmp_path / "off.journal", reduction=3, min_validations=1, early=False)
    assert not off.ticket("b", prune=False).probe  # probe off: not even the baselines probe


@pytest.mark.parametrize("best_leads_at_2", [True, False])
def test_early_rung_of_a_later_first_rung_is_a_third_of_the_way_there(tmp_path: Path, best_leads_at_2: bool) -> None:
    """First rung at 6 validations: the early rung is validation 2, where the best baseline must lead
    the baselines for it to move there; a candidate stopped there says so, one kept there is next
    judged at 18."""
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations=6, early="auto")
    for b in range(3):  # base0 ends best; at validation 2 it leads or trails the others
        ticket = rungs.ticket(f"base{b}", prune=False)
        reporter = ticket.reporter()
        for k in range(1, 19):
            late = 0.5 + 0.01 * b if k >= 3 else 0.6 + (0.01 * b if best_leads_at_2 else -0.01 * b)
            reporter(k, late, k == 18)
        rungs.close(ticket, TrialResult(val_ne=0.5 + 0.01 * b, mflops=1.0))
    assert rungs.calibrate() is None  # a fixed first rung
    candidate = rungs.ticket("c")
    reporter = candidate.reporter()
    reporter(1, 0.9)
    if not best_leads_at_2:
        assert rungs.early is None and "no early rung at validation 2" in rungs.early_note and candidate.early == -1
        reporter(2, 0.9)  # not judged before the first rung
        with pytest.raises(TrialPruned, match="after validation 6"):
            for k in range(3, 7):
                reporter(k, 0.9)
        return
    assert rungs.early == 2 and candidate.early == 2 and not candidate.probe
    assert "an early rung at validation 2, 1/3 of the first rung's" in rungs.early_note
    with pytest.raises(TrialPruned, match="^pruned at the early rung \\(validation 2\\)") as e:
        reporter(2, 0.9)
    assert pruned_early(TrialResult.pruning(str(e.value), val_ne=0.9, mflops=1.0, params=1, train_seconds=0.0,
                                            steps=2))
    rungs.close(candidate, TrialResult.pruning(str(e.value), val_ne=0.9, mflops=1.0, params=1, train_seconds=0.0,
                                               steps=2))
    kept = rungs.ticket("d").reporter()
    for k in (1, 2):  # the best at validation 2: kept there
        kept(k, 0.59)
    for k in range(3, 18):  # the first rung moved to validation 2: last at 6, yet not judged there
        kept(k, 0.9)
    with pytest.raises(TrialPruned, match="after validation 18"):  # the next rung stays
        kept(18, 0.9)


def test_hyperband_brackets_first_judge_at_later_rungs(tmp_path: Path) -> None:
    """Hyperband (Li et al. 2018): with the largest resource 10 validations (Optuna: the longest
    finished curve + 1) and reduction 3 there are floor(log3(10)) + 1 = 3 brackets, whose first rungs are at 1, 3 and 9 validations. A candidate
    worse than every other trial is stopped at its bracket's first rung, so across many candidates
    the validations at which they stop are exactly {1, 3, 9}; under ``asha`` every one stops at 1."""
    def stops(rule: str) -> list[int]:
        rungs = Rungs(None, None, tmp_path / f"{rule}.journal", reduction=3, min_validations=1, rule=rule)
        for b in range(6):  # baselines: finished curves of 9 validations, better than any candidate
            ticket = rungs.ticket(f"base{b}", prune=False)
            reporter = ticket.reporter()
            for k in range(1, 10):
                reporter(k, 0.5 + 0.01 * b, k == 9)
            rungs.close(ticket, TrialResult(val_ne=0.5 + 0.01 * b, mflops=1.0))
        at = []
        for i in range(40):
            ticket = rungs.ticket(f"c{i}")
            reporter = ticket.reporter()
            for k in range(1, 13):
                try:
                    reporter(k, 0.9 + 0.001 * i, k == 12)
                except TrialPruned:
                    at.append(k)
                    break
            rungs.close(ticket, TrialResult.pruning("x", val_ne=0.9, mflops=1.0, params=1, train_seconds=0.0, steps=k))
        return at

    assert set(stops("asha")) == {1}
    assert set(stops("hyperband")) == {1, 3, 9}


def _curve(rng: np.random.Generator) -> dict[int, float]:
    """A best-so-far validation curve (what trials report): 1 to 11 validations, never rising."""
    n = int(rng.integers(1, 12))
    return {k + 1: float(v) for k, v in enumerate(np.minimum.accumulate(rng.uniform(0.5, 0.9) - np.cumsum(
        rng.uniform(0, 0.05, n) * rng.integers(0, 2, n))))}


def test_first_rung_is_the_earliest_at_which_optunas_successive_halving_keeps_the_best() -> None:
    """Against Optuna's own SuccessiveHalvingPruner: the auto first rung is the smallest
    ``min_resource`` under which that pruner, shown every other baseline's whole curve first, never
    stops the baseline of the lowest final value."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def optuna_keeps(curves: dict[str, dict[int, float]], best: str, m: int) -> bool:
        study = optuna.create_study(pruner=optuna.pruners.SuccessiveHalvingPruner(
            min_resource=m, reduction_factor=3, min_early_stopping_rate=0))
        for name in [*(c for c in curves if c != best), best]:
            trial, stopped = study.ask(), False
            for k, v in sorted(curves[name].items()):  # the others report on: baselines are never stopped
                trial.report(v, k)
                stopped = trial.should_prune() or stopped
            study.tell(trial, curves[name][max(curves[name])])
        return not stopped

    rng = np.random.default_rng(0)
    later = 0
    for _ in range(40):
        curves = {str(b): _curve(rng) for b in range(int(rng.integers(2, 7)))}
        best = min(curves, key=lambda b: curves[b][max(curves[b])])
        expected = next(m for m in range(1, 13) if optuna_keeps(curves, best, m))
        assert first_rung(curves, best, 3) == expected, (curves, best)
        later += expected > 1
    assert later >= 5  # the cases are not all the trivial first rung


@pytest.mark.slow
@pytest.mark.parametrize("first", ["auto", "1"])
def test_auto_first_rung_keeps_what_resembles_a_slow_starting_best_baseline(env, monkeypatch, first: str) -> None:
    """Two baselines: dlrm starts slower and ends best, deepfm leads after one validation. A rung at
    one validation would stop dlrm itself; ``auto`` puts the first rung at two validations (the
    earliest where dlrm leads), so candidates whose curves are dlrm's finish, where a fixed first
    rung of one validation stops them all."""
    slow, fast = [0.9, 0.6, 0.4], [0.7, 0.65, 0.64]
    like_slow = [[0.9 + 0.001 * i, 0.6 - 0.01 * i, 0.4] for i in range(8)]  # no ties at a rung
    monkeypatch.setattr(protocol, "accumulate", PlantedCurves([slow, fast, *like_slow]))
    lines: list[str] = []
    cfg = load_config(overrides=[*TINY, "search.trials=2", "search.baselines=[dlrm,deepfm]",
                                 f"search.pruning_min_validations={first}", "search.pruning_early_rung=false"])
    outcome = SearchRunner(cfg, echo=lines.append).run()
    statuses = list(outcome.table.loc[outcome.table["kind"] == "candidate", "status"])
    if first == "auto":
        assert statuses == ["ok", "ok"]
        assert any("first rung at 2 validations" in line and "dlrm" in line for line in lines)
    else:
        assert statuses == ["pruned"] * 6  # proposals stop at trials x reduction
        assert not any("first rung" in line for line in lines)


class PlantedCurves:
    """``accumulate`` during training: a planted NE curve per trained model, in training order."""

    def __init__(self, curves: list[list[float]]) -> None:
        self.curves, self.models, self.calls = curves, [], []  # models held, so that none is reused

    def __call__(self, model, batches, max_batches=0):
        i = next((j for j, m in enumerate(self.models) if m is model), None)
        if i is None:
            i = len(self.models)
            self.models.append(model)
            self.calls.append(0)
        k, self.calls[i] = self.calls[i], self.calls[i] + 1
        ne = self.curves[i][min(k, len(self.curves[i]) - 1)]
        return Scored(ne, ne)


@pytest.fixture()
def env(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path_factory.getbasetemp() / "pruning-data"))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True])
def test_pruned_trial_is_its_own_status_keeps_its_curve_and_gives_its_slot_back(env, monkeypatch, tmp_path,
                                                                                shared: bool) -> None:
    from mlflow import MlflowClient

    # baseline, then candidates: the first is worse than the baseline at rung 1 and pruned there;
    # the next two lead their rungs and finish. Two trials: the pruned one's slot goes to a third.
    planted = PlantedCurves([[0.5, 0.5, 0.5], [0.9, 0.9, 0.9], [0.4, 0.35, 0.3], [0.3, 0.3, 0.3]])
    monkeypatch.setattr(protocol, "accumulate", planted)
    lines: list[str] = []
    storage = f"sqlite:///{tmp_path}/optuna.db"
    extra = [f"search.storage={storage}", "search.study_name=s"] if shared else []
    cfg = load_config(overrides=[*TINY, "search.trials=2", "search.baselines=[dlrm]", *extra])
    outcome = SearchRunner(cfg, echo=lines.append).run()
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    assert sorted(cands["status"]) == ["ok", "ok", "pruned"]
    assert any(" pruned: val/ne 0.9000" in line for line in lines)
    client = MlflowClient(env)
    runs = client.search_runs([client.get_experiment_by_name("rankitect").experiment_id],
                              f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'")
    pruned = [r for r in runs if r.data.tags.get("rankitect.status") == "pruned"]
    assert len(pruned) == 1 and pruned[0].info.status == "KILLED"
    curve = client.get_metric_history(pruned[0].info.run_id, "val/ne")
    assert {(m.step, m.value) for m in curve} == {(32, 0.9)}  # the partial curve: one epoch's validation
    assert not outcome.table.loc[outcome.table["status"] == "pruned", "winner"].any()
    if shared:  # the rung study lives in the shared storage; the pruned proposal holds no slot
        import optuna

        from rankitect.search.running.shared_study import shared_trial_count

        rungs = optuna.load_study(study_name="s.rungs", storage=storage).get_trials()
        assert len(rungs) == 4 and all(1 in t.intermediate_values for t in rungs)
        assert shared_trial_count(storage, "s", with_pruned=True) == (2, 3)


@pytest.mark.slow
def test_a_search_stops_a_candidate_at_the_probe_where_the_baselines_probes_keep_the_best(env, monkeypatch) -> None:
    """Planted curves start with the probe (a third of the first epoch): dlrm leads there and ends
    best, so candidates are judged at the probe; the first candidate is last there and stops after
    a third of an epoch, its partial curve that probe; the second leads and finishes."""
    from mlflow import MlflowClient

    planted = PlantedCurves([[0.6, 0.5, 0.5, 0.5], [0.7, 0.55, 0.55, 0.55], [0.9] * 4, [0.55, 0.4, 0.4, 0.4]])
    monkeypatch.setattr(protocol, "accumulate", planted)
    lines: list[str] = []
    cfg = load_config(overrides=[*TINY, "search.trials=1", "search.baselines=[dlrm,deepfm]"])
    outcome = SearchRunner(cfg, echo=lines.append).run()
    assert any(line.startswith("pruning_early_rung auto: an early rung at the probe, 1/3") and "dlrm" in line
               for line in lines)
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    assert sorted(cands["status"]) == ["ok", "pruned"]
    assert any(" pruned: val/ne 0.9000 after 10 steps" in line for line in lines)  # 32 steps an epoch
    client = MlflowClient(env)
    runs = client.search_runs([client.get_experiment_by_name("rankitect").experiment_id],
                              f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'")
    pruned = [r for r in runs if r.data.tags.get("rankitect.status") == "pruned"]
    curve = client.get_metric_history(pruned[0].info.run_id, "val/ne")
    assert {(m.step, m.value) for m in curve} == {(10, 0.9)}


def test_every_candidate_pruned_still_ends(env, monkeypatch) -> None:
    planted = PlantedCurves([[0.5] * 3] + [[0.9] * 3] * 20)
    monkeypatch.setattr(protocol, "accumulate", planted)
    cfg = load_config(overrides=[*TINY, "search.trials=2", "search.baselines=[dlrm]", "search.pruning_reduction=2"])
    outcome = SearchRunner(cfg, echo=lambda line: None).run()
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    assert list(cands["status"]) == ["pruned"] * 4  # proposals stop at trials x reduction
    assert outcome.table.loc[outcome.table["winner"], "name"].tolist() == ["dlrm"]  # the baseline competes


@pytest.mark.slow
def test_hyperband_through_the_runner(env, monkeypatch) -> None:
    """With 3 validations a training and reduction 2, hyperband's brackets first judge at 1, 2 and 4
    validations: candidates worse than the baseline stop at 1 or 2, or (first rung past the end of
    training) finish; the search ends all the same. (Trials fall into brackets by a hash of the
    study name and trial number, the same in every run.)"""
    planted = PlantedCurves([[0.5] * 3] + [[0.9 + 0.001 * i] * 3 for i in range(40)])  # each worse than the last
    monkeypatch.setattr(protocol, "accumulate", planted)
    cfg = load_config(overrides=[*TINY, "search.trials=4", "search.baselines=[dlrm]", "search.pruning_reduction=2",
                                 "search.pruning=hyperband"])
    outcome = SearchRunner(cfg, echo=lambda line: None).run()
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    assert set(cands["status"]) == {"pruned", "ok"}  # asha would prune every one (see the test above)
    assert (cands["status"] == "ok").sum() <= 4 and len(cands) <= 4 * 2
    assert outcome.table.loc[outcome.table["winner"], "name"].tolist() == ["dlrm"]


def test_time_budget_stops_new_candidates(env) -> None:
    box: dict[str, SearchRunner] = {}

    def clock() -> float:  # 100 s go by with every finished trial
        runner = box.get("runner")
        return 0.0 if runner is None else 100.0 * len(runner.state.trials)

    lines: list[str] = []
    cfg = load_config(overrides=[*TINY, "train.max_epochs=1", "search.trials=10", "search.baselines=[]",
                                 "search.time_budget=4m10s"])
    runner = SearchRunner(cfg, echo=lines.append, clock=clock)
    box["runner"] = runner
    outcome = runner.run()
    assert len(runner.state.candidates()) == 3  # started at 0, 100 and 200 s; none at 300 s
    assert any(line.startswith("time budget spent (5.0 of 4.2 min)") for line in lines)
    assert outcome.spending["total"] == 300.0
    trained = sum(outcome.spending[k] for k in ("candidates", "pruned", "failed"))
    assert trained == pytest.approx(sum(t.result.train_seconds for t in runner.state.candidates()))
    from mlflow import MlflowClient

    metrics = MlflowClient(env).get_run(outcome.parent_run_id).data.metrics
    assert metrics["budget/total_seconds"] == 300.0 and "budget/pruned_seconds" in metrics


@pytest.mark.parametrize("bad", ["soon", "-5m", "0", "5 parsecs"])
def test_bad_time_budget_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="search.time_budget"):
        parse_duration(bad)


@pytest.mark.slow
def test_search_with_workers_prunes_through_the_journal(env) -> None:
    cfg = load_config(overrides=[*TINY, "search.trials=3", "search.workers=2", "search.baselines=[dlrm]"])
    outcome = SearchRunner(cfg, echo=lambda line: None).run()
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    finished = int((cands["status"] != "pruned").sum())
    # a pruned trial's slot went to another, until 3 finished or proposals reached 3 x reduction 3
    assert finished == 3 or (finished < 3 and len(cands) == 9), cands["status"].tolist()
    assert (outcome.out_dir / "rungs.journal").is_file()
    assert os.path.getsize(outcome.out_dir / "rungs.journal") > 0
