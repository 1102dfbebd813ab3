"""The search runner end to end: MLflow contents, failures, kill -9 and resume, shared storage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rankitect.cli import main
from rankitect.config import load_config
from rankitect.search.running.checkpoint import load_state
from rankitect.search.running.runner import SearchRunner

from tests.learnable import learnable_source
from .pg_server import postgres_server
from .together import start_together

TINY = [
    f"data.source={learnable_source()}", "train.max_epochs=2", "train.grace_steps=33", "train.batch_size=64",
    "train.val_batches=2", "search.pruning=none",
    "train.test_batches=2", "search.evolution.population=2", "search.evolution.sample_size=2", "runtime.threads=1", "search.workers=1",
]
ROOT = Path(__file__).resolve().parents[2]


def _client():
    from mlflow import MlflowClient

    return MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def _children(parent: str) -> list:
    c = _client()
    exp = [e.experiment_id for e in c.search_experiments()]
    return list(c.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000))


def _has_model(run_id: str) -> bool:
    return "model/model.safetensors" in {f.path for f in _client().list_artifacts(run_id, "model")}


@pytest.mark.slow
def test_evolution_search_end_to_end(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["search", "--strategy", "evolution", "--trials", "3", *TINY, "search.baselines=[dlrm]"])
    assert code == 0
    out = capsys.readouterr().out
    parent = out.split("MLflow search run: ")[1].split()[0]
    runs = _children(parent)
    kinds = sorted(r.data.tags["rankitect.kind"] for r in runs)
    assert kinds == ["baseline", "candidate", "candidate", "candidate"]
    for r in runs:
        assert r.info.status == "FINISHED"
        for metric in ("val/ne", "test/ne", "test/auc", "test/logloss", "mflops", "params", "train_seconds"):
            assert metric in r.data.metrics, metric
        assert r.data.metrics["mflops"] > 0
    hashes = {r.data.tags["genotype_hash"] for r in runs if r.data.tags["rankitect.kind"] == "candidate"}
    assert len(hashes) == 3
    parent_run = _client().get_run(parent)
    assert parent_run.info.status == "FINISHED" and parent_run.data.tags["rankitect.kind"] == "search"
    assert main(["runs", parent]) == 0
    listed = capsys.readouterr().out
    assert all(h in listed for h in hashes) and "dlrm" in listed


def test_failed_candidate_becomes_failed_run_and_search_goes_on(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import rankitect.train.loop as loop

    real, calls = loop.train_architecture, []

    def flaky(arch, data, cfg, **kw):
        calls.append(arch.hash)
        if len(calls) == 2:
            raise RuntimeError("boom in candidate two")
        return real(arch, data, cfg, **kw)

    monkeypatch.setattr(loop, "train_architecture", flaky)
    cfg = load_config(overrides=[*TINY, "search.strategy=random", "search.trials=3", "search.baselines=[]"])
    outcome = SearchRunner(cfg, echo=lambda s: None).run()
    runs = _children(outcome.parent_run_id)
    assert len(runs) == 3  # the search went on after the failure
    # A random candidate (its recipe drawn too) may also fail on its own on this tiny data: only the
    # second is certain to, with its own error.
    boom = [r for r in runs if "boom in candidate two" in r.data.tags.get("error", "")]
    assert len(boom) == 1 and boom[0].info.status == "FAILED"
    assert any(r.info.status == "FINISHED" for r in runs)
    assert outcome.table["status"].tolist().count("failed") == sum(r.info.status == "FAILED" for r in runs)


def test_diverging_candidate_fails_cleanly(env: dict[str, str]) -> None:
    cfg = load_config(overrides=[*TINY, "search.strategy=random", "search.trials=1", "search.baselines=[]",
                                 "train.lr_dense=1e30", "train.lr_sparse=1e30", "train.steps=8", "train.grace_steps=0"])
    outcome = SearchRunner(cfg, echo=lambda s: None).run()
    (run,) = _children(outcome.parent_run_id)
    assert run.info.status == "FAILED"
    assert "TrialDiverged" in run.data.tags["error"]


@pytest.mark.slow
def test_same_seed_same_architectures(env: dict[str, str]) -> None:
    seqs = []
    for _ in range(2):
        cfg = load_config(overrides=[*TINY, "search.strategy=evolution", "search.trials=4", "search.baselines=[]",
                                     "train.steps=1", "train.grace_steps=0", "search.seed=7"])
        outcome = SearchRunner(cfg, echo=lambda s: None).run()
        state = load_state(outcome.out_dir / "state.json")
        seqs.append([t.name for t in state.candidates()])
    assert seqs[0] == seqs[1] and len(set(seqs[0])) == 4


def _search_cmd(*extra: str) -> list[str]:
    given = {a.partition("=")[0] for a in extra}  # a key given twice on a command line is an error
    return [sys.executable, "-m", "rankitect", "search", *(a for a in TINY if a.partition("=")[0] not in given),
            "search.baselines=[]", *extra]


def _wait_for(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_repeats_nothing(env: dict[str, str], tmp_path: Path) -> None:
    cmd = _search_cmd("--strategy", "evolution", "--trials", "5", "train.steps=6", "train.grace_steps=0")
    log = open(tmp_path / "search.err", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=log, text=True)
    first = proc.stdout.readline()
    assert "search run " in first, (tmp_path / "search.err").read_text()[-3000:]
    parent = first.split("search run ")[1].split(":")[0]
    state_path = Path(_client().get_run(parent).data.tags["rankitect.checkpoint"])

    def two_done() -> bool:
        return state_path.exists() and len(json.loads(state_path.read_text())["trials"]) >= 2

    _wait_for(two_done, 240, "two finished trials")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = load_state(state_path)
    assert not before.done
    done = subprocess.run([sys.executable, "-m", "rankitect", "search", "--resume", parent], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = load_state(state_path)
    assert after.done and len(after.candidates()) == 5
    assert [t.name for t in after.trials[:len(before.trials)]] == [t.name for t in before.trials]
    names = [t.name for t in after.candidates()]
    assert len(set(names)) == 5, names
    runs = _children(parent)
    assert sorted(r.data.tags["rankitect.trial"] for r in runs) == sorted(str(t.number) for t in after.trials)
    assert len({r.data.tags["genotype_hash"] for r in runs}) == 5


@pytest.mark.slow
def test_two_processes_share_one_sqlite_study(env: dict[str, str], tmp_path: Path) -> None:
    _two_processes_share_one_search(f"sqlite:///{tmp_path}/study.db", env, tmp_path)


@pytest.mark.slow
def test_two_processes_share_one_postgresql_study(env: dict[str, str], tmp_path: Path) -> None:
    """The same over PostgreSQL (the storage of processes on several machines), on a server this
    test starts on 127.0.0.1 and stops by its pid."""
    with postgres_server() as storage:
        _two_processes_share_one_search(storage, env, tmp_path)


def _two_processes_share_one_search(storage: str, env: dict[str, str], tmp_path: Path) -> None:
    cmd = _search_cmd("--strategy", "random", "--trials", "4", "--storage", storage, "--study-name", "shared")
    first, second = start_together([cmd[3:]] * 2, env, tmp_path)  # both start on a fresh storage at once
    outs = [p.communicate(timeout=600) for p in (first, second)]
    for p, (out, err) in zip((first, second), outs):
        assert p.returncode == 0, err[-2000:]
    import optuna

    study = optuna.load_study(study_name="shared", storage=storage)
    # Proposals that ran: neither a duplicate nor past the budget (two processes proposing the
    # last trial at once: the later proposal is marked over_budget and never trained).
    done = [t for t in study.get_trials() if "genotype_hash" in t.user_attrs
            and "duplicate_of" not in t.user_attrs and "over_budget" not in t.user_attrs]
    hashes = [t.user_attrs["genotype_hash"] for t in done]
    assert len(hashes) == 4 and len(set(hashes)) == 4
    parents = {o.split("search run ")[1].split(":")[0] for o, _ in outs}
    assert len(parents) == 1
    parents_id = parents.pop()
    runs = _children(parents_id)
    assert sorted(r.data.tags["genotype_hash"] for r in runs) == sorted(hashes)
    per_process = [o.count("] ") for o, _ in outs]
    assert sum(per_process) == 4, per_process  # how they split the work depends on timing
    # One folder (one parent run), a checkpoint per process, and no process pruned another's weights.
    folder = Path(_client().get_run(parents_id).data.tags["rankitect.checkpoint"]).parent
    states = sorted(folder.glob("state*.json"))
    assert len(states) == 2 and "state.json" in {p.name for p in states}
    owned = [t["name"] for p in states for t in json.loads(p.read_text())["trials"]]
    assert sorted(owned) == sorted(hashes)
    assert not list((folder / "weights").glob("*")) if (folder / "weights").exists() else True
    kept = {r.data.tags["genotype_hash"] for r in runs if _has_model(r.info.run_id)}  # in MLflow only
    for p in states:  # each process keeps its top search.keep_top_k (3) of its own trained candidates
        mine = [t["name"] for t in json.loads(p.read_text())["trials"] if t["result"]["status"] == "ok"]
        assert len(kept & set(mine)) == min(3, len(mine)), (mine, kept)
    # The process that finished last wrote the Pareto table with every process's candidates.
    pareto = pd.read_csv(folder / "pareto.csv")
    assert sorted(pareto["hash"]) == sorted(hashes)


def test_local_process_pool_runs_every_trial_once(env: dict[str, str]) -> None:
    cfg = load_config(overrides=[*TINY, "search.strategy=random", "search.trials=3", "search.baselines=[dlrm]",
                                 "search.workers=2"])
    outcome = SearchRunner(cfg, echo=lambda s: None).run()
    runs = _children(outcome.parent_run_id)
    assert sorted(r.data.tags["rankitect.kind"] for r in runs) == ["baseline", "candidate", "candidate", "candidate"]
    # Every trial ran to an end; a random candidate (its recipe drawn too) may diverge on this tiny data.
    assert all(r.info.status == "FINISHED" or "TrialDiverged" in r.data.tags.get("error", "") for r in runs)
    assert len({r.data.tags["genotype_hash"] for r in runs}) == 4
    dlrm = next(r for r in runs if r.data.tags["rankitect.kind"] == "baseline")
    assert _has_model(dlrm.info.run_id)  # written by a worker process, moved to the run by this one


def test_rocs_search_ranks_candidates_by_request_shared_flops(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """``search.rocs=true``: masked candidates with a searched request share; their ``mflops`` (what
    the objective and the Pareto front use) are the request-shared FLOPs, logged beside the rest."""
    code = main(["search", "--strategy", "random", "--trials", "2", *TINY, "search.baselines=[]", "search.rocs=true"])
    assert code == 0
    parent = capsys.readouterr().out.split("MLflow search run: ")[1].split()[0]
    runs = [r for r in _children(parent) if r.data.tags["rankitect.kind"] == "candidate"]
    assert len(runs) == 2
    for r in runs:
        m = r.data.metrics
        assert m["mflops"] == pytest.approx(m["rocs/mflops_per_example"])
        assert m["rocs/mflops_per_example"] < m["rocs/mflops_unshared"]
        assert m["rocs/mflops_per_request"] > 0 and m["rocs/candidates_per_request"] > 1
