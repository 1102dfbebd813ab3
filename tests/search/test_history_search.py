"""A CSV with a history column, end to end: ``rankitect search --strategy dnas`` trains DIN and BST
among the baselines, searches the history choices in its supernet, trains candidates, and the winner's
export scores raw rows outside rankitect with the model's logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankitect.cli import main
from tests.export.test_history_export import SCHEMA, check_raw_row_scores, write_history_csv

HISTORY_OPS = {"history_pool", "target_attention", "history_transformer", "history_cross"}


@pytest.mark.slow
def test_a_dnas_search_on_a_csv_with_a_history_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    data_csv, schema = tmp_path / "clicks.csv", tmp_path / "schema.yaml"
    write_history_csv(data_csv, 900, seed=3)
    schema.write_text(SCHEMA.format(vocab="train"))
    code = main(["search", "--strategy", "dnas", f"data.source={data_csv}", f"data.schema={schema}",
                 "search.trials=2", "train.max_epochs=2", "train.batch_size=64", "train.progress=false",
                 "search.dnas.supernet.steps=30", "runtime.threads=1"])
    assert code == 0
    out = capsys.readouterr().out
    parent = out.split("MLflow search run: ")[1].split()[0]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    state = json.loads(Path(client.get_run(parent).data.tags["rankitect.checkpoint"]).read_text())
    ops = {t["name"]: {b["op"] for b in t["arch"]["blocks"]} for t in state["trials"]}
    kinds = {t["name"]: t["kind"] for t in state["trials"]}
    assert {"din", "bst"} <= {n for n, k in kinds.items() if k == "baseline"}  # the default list, on history data
    assert ops["din"] == {"target_attention"} and ops["bst"] == {"history_transformer"}
    candidates = [n for n, k in kinds.items() if k == "candidate"]
    assert candidates and any(ops[n] & HISTORY_OPS for n in candidates)
    exp = [e.experiment_id for e in client.search_experiments()]
    supernet = next(r for r in client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'")
                    if r.data.tags["rankitect.kind"] == "supernet")
    assert "entropy/history.op" in supernet.data.metrics  # the supernet searched the history routing

    exported = tmp_path / "winner"
    assert main(["export", parent, "-o", str(exported)]) == 0
    check_raw_row_scores(exported, data_csv, schema, tmp_path)
