"""What commands read back from and add to runs, checked with a plain MlflowClient: settings found
up the run tree, a kept model, a per-step curve, the supernet a search kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from rankitect.data.spec import FeatureSpec
from rankitect.eval.result import TrialResult
from rankitect.space.testing import tiny_spec
from rankitect.track import Tracker
from rankitect.track.names import KIND, PARENT
from tests.search.toy import ToyArch

RESULT = TrialResult(val_ne=0.8, test_ne=0.81, test_auc=0.7, test_logloss=0.45, mflops=1.0, params=10)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    tracker = Tracker(uri, experiment="run-files")
    parent = tracker.start_search({"data": {"rows": 8000, "source": "synthetic"}}, "oneshot", "toy")
    child = tracker.log_trial(parent, ToyArch((8,), "relu"), RESULT)
    alone = tracker.log_trial(None, ToyArch((4,), None), RESULT)
    return tracker, MlflowClient(uri), parent, child, alone


def test_logged_settings_come_from_the_nearest_run_that_has_them(store) -> None:
    tracker, client, parent, child, alone = store
    assert tracker.logged_settings(parent, "data") == ({"rows": "8000", "source": "synthetic"}, parent)
    assert tracker.logged_settings(child, "data") == ({"rows": "8000", "source": "synthetic"}, parent)
    assert tracker.logged_settings(child, "search") == ({}, child)  # no run above it logged search.*
    assert tracker.logged_settings(alone, "data") == ({}, alone)
    own = tracker.log_trial(parent, ToyArch((2,), None), RESULT, params={"data.rows": "500"})
    assert tracker.logged_settings(own, "data") == ({"rows": "500"}, own)  # its own win over its search's


def test_log_model_keeps_weights_and_spec_that_fetch_gives_back(store, tmp_path: Path) -> None:
    tracker, client, _, child, _ = store
    state = {"w": torch.arange(6.0).reshape(2, 3).t(), "b": torch.zeros(3)}  # a strided tensor too
    spec = tiny_spec()
    tracker.log_model(child, state, spec)
    files = tracker.fetch_model_files(child, tmp_path)
    kept = load_file(str(files.weights))
    assert set(kept) == {"w", "b"} and all(torch.equal(kept[k], state[k]) for k in state)
    assert FeatureSpec.load(files.spec) == spec
    assert {f.path for f in client.list_artifacts(child, "model")} == {"model/model.safetensors",
                                                                        "model/feature_spec.json"}


def test_log_per_step_puts_each_value_at_its_step(store) -> None:
    tracker, client, _, _, alone = store
    values = [0.7 - 0.001 * i for i in range(1500)]  # more than one MLflow batch
    tracker.log_per_step(alone, "train/loss", values)
    history = sorted(client.get_metric_history(alone, "train/loss"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(1500))
    assert [m.value for m in history] == pytest.approx(values)


def test_fetch_search_artifact_finds_the_search_supernet_run(store, tmp_path: Path) -> None:
    tracker, client, parent, child, alone = store
    assert tracker.fetch_search_artifact(child, "supernet", "supernet", tmp_path / "none") is None  # none kept yet
    assert tracker.fetch_search_artifact(alone, "supernet", "supernet", tmp_path / "none") is None  # no search
    run = client.create_run(tracker.experiment_id, tags={KIND: "supernet", PARENT: parent})
    folder = tmp_path / "made" / "supernet"
    folder.mkdir(parents=True)
    (folder / "weights.txt").write_text("w")
    client.log_artifacts(run.info.run_id, str(folder), "supernet")
    for start in (child, parent):  # a candidate of the search, or the search itself
        got = tracker.fetch_search_artifact(start, "supernet", "supernet", tmp_path / start)
        assert got is not None and (got / "weights.txt").read_text() == "w"
