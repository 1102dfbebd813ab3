"""Processes of one shared search started at the same instant on a fresh storage (what workers
launched by one cluster job do): none dies on Optuna's table creation, and they agree on one
parent run, one budget and one Pareto table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from .pg_server import postgres_server
from .together import start_together

PROCESSES = 4
TINY = ["data.rows=3000", "train.steps=1", "train.batch_size=64", "train.val_every=1", "train.val_batches=1",
        "train.test_batches=1", "runtime.threads=1", "search.workers=1", "search.baselines=[]", "search.flops_range=null"]


@pytest.fixture()
def env(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from rankitect.data import open_data

    data_dir = tmp_path_factory.getbasetemp() / "together-data"
    open_data("synthetic", rows=3000, seed=0, cache_dir=data_dir)  # the data race is not what this tests
    return {**os.environ, "RANKITECT_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns/mlflow.db"}


@pytest.mark.slow
def test_four_processes_start_together_on_a_fresh_sqlite_storage(env: dict[str, str], tmp_path: Path) -> None:
    _start_together_and_check(f"sqlite:///{tmp_path}/study.db", env, tmp_path)


@pytest.mark.slow
def test_four_processes_start_together_on_a_fresh_postgresql_storage(env: dict[str, str], tmp_path: Path) -> None:
    with postgres_server() as storage:
        _start_together_and_check(storage, env, tmp_path)


def _start_together_and_check(storage: str, env: dict[str, str], tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from rankitect.search._optuna import counts
    from rankitect.search.running.shared_study import load_shared_study

    argv = ["search", "--strategy", "random", "--trials", "4", "--storage", storage, "--study-name", "s", *TINY]
    procs = start_together([argv] * PROCESSES, env, tmp_path)
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    parents = {out.split("search run ")[1].split(":")[0] for out, _ in outs}
    assert len(parents) == 1, parents  # one parent run, opened by exactly one of them
    parent = parents.pop()
    hashes = [t.user_attrs["genotype_hash"] for t in load_shared_study(storage, "s").get_trials() if counts(t)]
    assert len(hashes) == 4 == len(set(hashes))  # the budget holds across the four
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.data.tags["genotype_hash"] for r in runs) == sorted(hashes)
    folder = Path(client.get_run(parent).data.tags["rankitect.checkpoint"]).parent
    states = [json.loads(p.read_text()) for p in folder.glob("state*.json")]
    assert len(states) == PROCESSES and (folder / "state.json").is_file()
    assert sorted(t["name"] for s in states for t in s["trials"]) == sorted(hashes)
    assert sorted(pd.read_csv(folder / "pareto.csv")["hash"]) == sorted(hashes)
