"""Faults in a search: a kill between the checkpoint's two writes of a shared search, signals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankitect.config import load_config
from rankitect.search.running.checkpoint import load_state
from rankitect.search.running.runner import SearchRunner

TINY = ["data.rows=3000", "train.steps=1", "train.batch_size=64", "train.val_every=1", "train.val_batches=1",
        "train.test_batches=1", "runtime.threads=1", "search.workers=1", "search.baselines=[]", "search.strategy=random",
        "search.pruning=none"]


def _client():
    from mlflow import MlflowClient

    return MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def _children(parent: str, stage: str = "active") -> list:
    from mlflow.entities import ViewType

    c = _client()
    exp = [e.experiment_id for e in c.search_experiments()]
    view = ViewType.ACTIVE_ONLY if stage == "active" else ViewType.ALL
    return list(c.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'", run_view_type=view))


def test_resume_of_a_shared_search_reconciles_only_its_own_runs(env: dict[str, str], tmp_path: Path) -> None:
    """Two processes of one shared search both number their trials 0, 1; the first is killed
    between writing trial 1 to its checkpoint and noting its run id. Its resume replaces its own
    half-written run and leaves the other process's trial 1 alone."""
    shared = [*TINY, f"search.storage=sqlite:///{tmp_path}/study.db", "search.study_name=s"]
    first = SearchRunner(load_config(overrides=[*shared, "search.trials=2"]), echo=lambda s: None)
    first.run()
    second = SearchRunner(load_config(overrides=[*shared, "search.trials=4"]), echo=lambda s: None)
    second.run()  # the same parent run; its trials are numbered 0 and 1 too
    parent = first.state.parent_run_id
    assert second.state.parent_run_id == parent and not second.owner
    assert [t.number for t in second.state.trials] == [0, 1] == [t.number for t in first.state.trials]
    raw = json.loads(first.path.read_text())
    half_written = raw["trials"][1]["run_id"]
    raw["trials"][1]["run_id"], raw["done"] = None, False  # as a kill between the two writes leaves it
    first.path.write_text(json.dumps(raw))

    SearchRunner.resume(parent, load_config(), echo=lambda s: None).run()
    active = {r.info.run_id for r in _children(parent)}
    assert {t.run_id for t in second.state.trials} <= active  # the other process's runs are untouched
    assert half_written not in active and len(active) == 4
    relogged = load_state(first.path).trials[1]
    assert relogged.run_id in active and relogged.trial_id == raw["trials"][1]["trial_id"]
    assert _client().get_run(relogged.run_id).data.tags["rankitect.trial_id"] == relogged.trial_id


def test_a_signal_during_a_trial_kills_it_and_resume_continues(env: dict[str, str], tmp_path: Path, monkeypatch) -> None:
    """SIGTERM arrives while the second candidate trains: it becomes a KILLED child run, the parent
    run is KILLED, the checkpoint holds the first trial, and a resume finishes every trial."""
    import signal

    from rankitect.search.running import trial
    from rankitect.signals import Stopped

    storage = f"sqlite:///{tmp_path}/study.db"
    cfg = load_config(overrides=[*TINY, "search.trials=3", f"search.storage={storage}", "search.study_name=s"])
    real, calls = trial.run_trial, []

    def second_gets_sigterm(arch, *args, **kwargs):
        calls.append(arch.hash)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the middle of the trial
        return real(arch, *args, **kwargs)

    monkeypatch.setattr(trial, "run_trial", second_gets_sigterm)
    runner = SearchRunner(cfg, echo=lambda s: None)
    with pytest.raises(Stopped) as stop:
        runner.run()
    assert stop.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    parent = runner.state.parent_run_id
    assert _client().get_run(parent).info.status == "KILLED"
    state = load_state(runner.path)
    assert [t.name for t in state.trials] == calls[:1] and state.trials[0].run_id is not None
    killed = [r for r in _children(parent) if r.info.status == "KILLED"]
    assert [r.data.tags["genotype_hash"] for r in killed] == [calls[1]]
    from rankitect.search._optuna import STOPPED_ATTR, counts
    from rankitect.search.running.shared_study import load_shared_study

    trials = load_shared_study(storage, "s").get_trials()
    assert [t.user_attrs["genotype_hash"] for t in trials if STOPPED_ATTR in t.user_attrs] == [calls[1]]
    assert sum(counts(t) for t in trials) == 1  # the stopped trial holds no slot of the budget

    monkeypatch.setattr(trial, "run_trial", real)
    SearchRunner.resume(parent, load_config(), echo=lambda s: None).run()
    state = load_state(runner.path)
    assert state.done and len(state.candidates()) == 3 and len({t.name for t in state.candidates()}) == 3
    ran = [r for r in _children(parent) if r.info.status != "KILLED"]  # finished or failed (1 step: may diverge)
    assert sorted(r.data.tags["genotype_hash"] for r in ran) == sorted(t.name for t in state.candidates())
    assert _client().get_run(parent).info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stopped_search_exits_128_plus_the_signal(env: dict[str, str], tmp_path: Path, signame: str) -> None:
    import signal
    import subprocess
    import sys

    tiny = [a for a in TINY if not a.startswith("train.steps=")]  # a key given twice on a command line is an error
    cmd = [sys.executable, "-m", "rankitect", "search", *tiny, "search.trials=20", "train.steps=50"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = proc.stdout.readline().split("search run ")[1].split(":")[0]
    for line in proc.stdout:  # the first trial finished: the search is in its loop
        if line.startswith("[1/20]"):
            break
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + getattr(signal, signame), err[-2000:]
    assert f"stopped by {signame}" in err and "Traceback" not in err
    assert f"--resume {parent}" in out
    assert _client().get_run(parent).info.status == "KILLED"
    state = load_state(Path(_client().get_run(parent).data.tags["rankitect.checkpoint"]))
    runs = {r.info.run_id: r for r in _children(parent)}
    assert state.trials and all(runs[t.run_id].info.status in ("FINISHED", "FAILED") for t in state.trials)
    assert len(runs) - len(state.trials) <= 1  # at most the trial it was running, KILLED
    assert all(r.info.status == "KILLED" for rid, r in runs.items() if rid not in {t.run_id for t in state.trials})


@pytest.mark.slow
def test_kept_weights_live_once_in_mlflow_as_safetensors(env: dict[str, str]) -> None:
    """keep_top_k=1 (and one finalist for the verdict) of four candidates: the best by validation NE
    (no FLOPs target, so the objective is NE), the baseline and the winner keep weights on their
    runs; every weight a candidate had while it led was taken off its run again; the output folder
    holds no weights."""
    from safetensors.torch import load_file

    from rankitect.space import build_model
    from rankitect.space.architecture import Architecture

    cfg = load_config(overrides=[*TINY, "search.trials=4", "search.keep_top_k=1", "search.baselines=[dlrm]",
                                 "search.target_mflops=null", "search.verdict.finalists=1",
                                 "train.steps=30", "train.val_every=10", "train.grace_steps=30"])
    runner = SearchRunner(cfg, echo=lambda s: None)
    outcome = runner.run()
    runs = _children(outcome.parent_run_id)
    with_model = {r.info.run_id for r in runs if "model" in {f.path for f in _client().list_artifacts(r.info.run_id)}}
    cands = [r for r in runs if r.data.tags["rankitect.kind"] == "candidate" and r.info.status == "FINISHED"]
    best = min(cands, key=lambda r: r.data.metrics["val/ne"])
    base = next(r for r in runs if r.data.tags["rankitect.kind"] == "baseline")
    winner = outcome.table.loc[outcome.table["winner"], "name"].item()
    won = {r.info.run_id for r in cands if r.data.tags.get("genotype_hash") == winner}
    assert with_model == {best.info.run_id, base.info.run_id} | won
    assert not list(outcome.out_dir.rglob("*.safetensors")) and not list(outcome.out_dir.rglob("*.pt"))
    folder = _client().download_artifacts(best.info.run_id, "model", str(outcome.out_dir / "dl"))
    state = load_file(f"{folder}/model.safetensors")
    arch = Architecture.from_json(Path(_client().download_artifacts(best.info.run_id, "genotype.json",
                                                                    str(outcome.out_dir / "dl"))).read_text())
    assert set(state) == set(build_model(arch, runner.data.spec).state_dict())


def test_every_command_stopped_by_a_signal_exits_128_plus_it(tmp_path: Path, monkeypatch, capsys) -> None:
    """Not only a search: ``data synth`` (and train, finetune...) stopped by SIGTERM report 143, not 0."""
    import signal

    import rankitect.data

    from rankitect.cli import main

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(rankitect.data, "generate_synthetic", terminated)
    assert main(["data", "synth", "-o", str(tmp_path / "d"), "--rows", "200"]) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
