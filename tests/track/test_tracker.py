"""What the tracker writes to MLflow, checked with a plain MlflowClient on a temporary SQLite store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from rankitect.eval.pareto import pareto_table
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.track import DEFAULT_URI, Tracker, resolve_uri, ui_command
from tests.search.toy import ToyArch, ToySpace

CONFIG = {"search": {"strategy": "evolution", "trials": 3, "baselines": ["dlrm", "dcnv2"]},
          "data": {"source": "synthetic", "note": "x" * 2000}}


class NamedSpace(ToySpace):
    name = "toy"

    def to_dict(self):
        return {k: list(c.options) for k, c in self.choices.items()}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # one SQLite store per module: MLflow's schema migrations are the slow part
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    return root, uri, Tracker(uri, experiment="toy-search")


@pytest.fixture(scope="module")
def search(store):
    root, uri, tracker = store
    parent = tracker.start_search(CONFIG, "evolution", NamedSpace())
    archs = [ToyArch((8,), "relu"), ToyArch((16, 32), None), ToyArch((64, 64, 8), "relu")]
    results = [
        TrialResult(val_ne=0.80, test_ne=0.82, test_auc=0.71, test_logloss=0.45, mflops=0.5, params=80,
                    train_seconds=1.5),
        TrialResult(val_ne=0.75, test_ne=0.76, test_auc=0.74, test_logloss=0.43, mflops=2.0, params=480,
                    train_seconds=2.5),
        TrialResult.failure("loss is NaN at step 40", mflops=9.0),
    ]
    children = [tracker.log_trial(parent, a, r, {"trial": str(i)}) for i, (a, r) in enumerate(zip(archs, results))]
    base = TrialResult(val_ne=0.78, test_ne=0.79, test_auc=0.72, test_logloss=0.44, mflops=1.0, params=100)
    children.append(tracker.log_trial(parent, ToyArch((32,), "relu"), base, baseline="dlrm"))
    table = pareto_table(zip(archs, results), {"dlrm": base}, objective=Objective())
    tracker.finish_search(parent, table, archs[1], {"strategy": "evolution", "asked": 3})
    return parent, children, archs, results, MlflowClient(uri)


def test_experiment_artifacts_live_beside_the_database(store, search):
    root, uri, tracker = store
    client = search[-1]
    exp = client.get_experiment_by_name("toy-search")
    assert Path(exp.artifact_location.removeprefix("file://")) == root / "artifacts"
    assert (root / "artifacts" / search[0]).is_dir()


def test_parent_run_has_config_space_and_final_artifacts(search):
    parent, _, archs, _, client = search
    run = client.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["rankitect.kind"] == "search"
    assert run.data.tags["rankitect.strategy"] == "evolution" and run.data.tags["rankitect.space"] == "toy"
    assert run.data.params["search.trials"] == "3"
    assert run.data.params["search.baselines"] == "['dlrm', 'dcnv2']"
    assert len(run.data.params["data.note"]) == 500  # cut; the whole config is an artifact
    files = {f.path for f in client.list_artifacts(parent)}
    assert files == {"config.yaml", "space.json", "pareto.csv", "pareto.png", "pareto.json", "best_genotype.json",
                     "search_state.json", "images"}
    # the plot is also an MLflow image of the run (its charts), the same pixels as pareto.png
    import matplotlib.image
    import numpy as np

    charts = [f.path for f in client.list_artifacts(parent, "images") if f.path.endswith(".png")]
    assert len(charts) == 1 and "pareto" in charts[0]
    png = matplotlib.image.imread(client.download_artifacts(parent, "pareto.png"))[..., :3]
    chart = matplotlib.image.imread(client.download_artifacts(parent, charts[0]))[..., :3]
    assert chart.shape == png.shape and np.abs(chart - png).max() <= 1 / 255
    # a name that tells searches apart: strategy, space, data and start time; the data as a tag
    assert run.info.run_name.startswith("evolution-toy-synthetic-")
    started = time.strftime("%Y%m%d-%H%M%S", time.localtime(run.info.start_time / 1000))
    assert run.info.run_name == f"evolution-toy-synthetic-{started}"
    assert run.data.tags["rankitect.data"] == "synthetic" and run.data.tags["rankitect.winner"] == archs[1].hash
    # the Pareto table as an MLflow table: the same rows as the CSV
    table = pd.read_csv(client.download_artifacts(parent, "pareto.csv"))
    logged = json.loads(Path(client.download_artifacts(parent, "pareto.json")).read_text())
    assert logged["columns"] == list(table.columns) and len(logged["data"]) == len(table)
    col = logged["columns"].index("test_ne")
    assert [r[col] for r in logged["data"]] == [None if pd.isna(v) else v for v in table["test_ne"]]
    config = yaml.safe_load(Path(client.download_artifacts(parent, "config.yaml")).read_text())
    assert config == CONFIG
    best = json.loads(Path(client.download_artifacts(parent, "best_genotype.json")).read_text())
    assert best == json.loads(archs[1].to_json())
    assert run.data.tags["best_genotype_hash"] == archs[1].hash
    # one name per metric: the search run's test/ne is its winner's, no best/* twins
    assert run.data.metrics["test/ne"] == 0.76 and run.data.metrics["mflops"] == 2.0
    assert not [k for k in run.data.metrics if k.startswith("best/")]


def test_experiment_is_for_model_training_with_a_metric_view(store, search):
    tracker, client = store[2], search[-1]
    tags = client.get_experiment(tracker.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.rankitect"])
    assert {"metrics.`test/ne`", "metrics.`mflops`"} <= set(view["selectedColumns"])
    # the runs list grouped by search: every run of a search carries its name, the search run too
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "rankitect.search"}]
    parent, children = search[0], search[1]
    name = client.get_run(parent).info.run_name
    assert client.get_run(parent).data.tags["rankitect.search"] == name
    assert {client.get_run(c).data.tags["rankitect.search"] for c in children} == {name}
    assert "viewStateShareKey=rankitect" in tracker.runs_view_path()
    assert "workflowType=machine_learning" in tracker.runs_view_path()


def test_child_runs_carry_real_times_choices_and_one_curve_name(store, search):
    tracker, client = store[2], search[-1]
    parent = tracker.start_search({"search": {"trials": 1}}, "random", "toy", name="another")
    arch = ToyArch((8,), "relu")
    result = TrialResult(val_ne=0.7, test_ne=0.71, test_auc=0.7, test_logloss=0.4, mflops=1.0, params=10,
                         train_seconds=30.0)
    before = time.time()
    history = [{"step": 10, "val/ne": 0.9}, {"step": 20, "val/ne": 0.8}]
    run_id = tracker.log_trial(parent, arch, result, params={"b0.width": 64}, start_time=before - 30, history=history)
    run = client.get_run(run_id)
    assert run.data.params == {"genotype_hash": arch.hash, "b0.width": "64"}
    assert run.info.end_time - run.info.start_time >= 30_000  # minutes of training read as such
    curve = client.get_metric_history(run_id, "val/ne")
    assert [(m.step, m.value) for m in curve] == [(10, 0.9), (20, 0.8), (20, 0.7)]
    assert run.data.metrics["val/ne"] == 0.7  # the final score is the latest value
    # a trial recorded long after it ended (a baseline waiting for its turn) spans its own start and end
    start = before - 3600.0
    late = tracker.log_trial(parent, arch, result, start_time=start, end_time=start + 444.6, history=history)
    info = client.get_run(late).info
    assert (info.start_time, info.end_time) == (int(start * 1000), int((start + 444.6) * 1000))
    stamps = [m.timestamp for m in client.get_metric_history(late, "val/ne")]
    assert all(info.start_time <= t <= info.end_time for t in stamps[:-1])  # the curve within the span


def test_children_are_nested_with_metrics_params_status_and_genotype(search):
    parent, children, archs, results, client = search
    for child, arch, result in zip(children, archs, results):
        run = client.get_run(child)
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.params == {"genotype_hash": arch.hash}
        assert run.info.run_name == arch.hash
        genotype = json.loads(Path(client.download_artifacts(child, "genotype.json")).read_text())
        assert genotype == json.loads(arch.to_json())
        expected = {"val/ne": result.val_ne, "test/ne": result.test_ne, "test/auc": result.test_auc,
                    "test/logloss": result.test_logloss, "mflops": result.mflops, "params": result.params,
                    "train_seconds": result.train_seconds}
        assert run.data.metrics == {k: v for k, v in expected.items() if v is not None}
    failed = client.get_run(children[2])
    assert failed.info.status == "FAILED" and failed.data.tags["error"] == "loss is NaN at step 40"
    assert client.get_run(children[0]).info.status == "FINISHED"
    baseline = client.get_run(children[3])
    assert baseline.data.tags["rankitect.kind"] == "baseline" and baseline.info.run_name == "dlrm"


def test_runs_table_is_sorted_by_test_ne_and_searches_are_listed(store, search):
    tracker, parent = store[2], search[0]
    df = tracker.runs_table(parent)
    assert df["name"].tolist()[:3] == [search[2][1].hash, "dlrm", search[2][0].hash]
    assert df["status"].iloc[-1] == "failed" and df["mflops"].iloc[-1] == 9.0
    assert df.loc[df["winner"], "name"].tolist() == [search[2][1].hash]  # the parent's winner, by name
    searches = tracker.searches_table().set_index("run_id")
    assert searches.loc[parent, "test/ne"] == 0.76
    assert searches.loc[parent, "data"] == "synthetic" and searches.loc[parent, "winner"] == search[2][1].hash


def test_pruned_trials_are_listed_as_pruned_and_a_baseline_winner_is_marked(store):
    tracker = store[2]
    parent = tracker.start_search({"data": {"source": "/data/clicks.csv"}}, "random", "toy")
    pruned = TrialResult.pruning("hopeless", val_ne=0.9, mflops=1.0, params=10, train_seconds=1.0, steps=5)
    ok = TrialResult(val_ne=0.8, test_ne=0.81, mflops=2.0, params=20, train_seconds=2.0)
    arch = ToyArch((8,), "relu")
    tracker.log_trial(parent, ToyArch((4,), "relu"), pruned)
    tracker.log_trial(parent, arch, ok, baseline="dlrm")
    tracker.log_trial(parent, arch, ok)  # a candidate with the baseline's genotype: not the winner
    table = pareto_table([(arch, ok), (ToyArch((4,), "relu"), pruned)], {"dlrm": ok}, winner=("baseline", "dlrm"))
    tracker.finish_search(parent, table, arch, {})
    df = tracker.runs_table(parent)
    assert sorted(df["status"]) == ["ok", "ok", "pruned"]  # not MLflow's KILLED
    assert df.loc[df["winner"], ["kind", "name"]].values.tolist() == [["baseline", "dlrm"]]
    assert tracker.searches_table().set_index("run_id").loc[parent, "data"] == "/data/clicks.csv"
    assert tracker.get_run(parent).info.run_name.startswith("random-toy-clicks-")


def test_uri_resolution_and_ui_command(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert DEFAULT_URI == "sqlite:///mlruns/mlflow.db"
    assert resolve_uri() == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    assert resolve_uri() == "http://localhost:5000"
    assert resolve_uri("sqlite:///x.db") == f"sqlite:///{tmp_path}/x.db"
    argv = ui_command("sqlite:///runs/m.db", host="0.0.0.0", port=6006)
    assert argv[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/runs/m.db",
                        "--host", "0.0.0.0", "--port", "6006", "--default-artifact-root", f"{tmp_path}/runs/artifacts"]
    assert "--default-artifact-root" not in ui_command()  # a server decides its own artifacts
    with pytest.raises(ValueError, match="port"):
        ui_command(port=0)
