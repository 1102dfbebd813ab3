"""From a tracked run to a standalone export and a fine-tuned run, through the CLI."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from rankitect.cli import main
from rankitect.data import open_data
from rankitect.space import Architecture, build_model

TINY = ["data.rows=8000", "train.batch_size=64", "train.test_batches=0", "search.pruning=none", "runtime.threads=1", "search.workers=1"]


@pytest.fixture()
def env(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path_factory.getbasetemp() / "export-data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run_id(out: str) -> str:
    return out.split("MLflow run: ")[1].split()[0]


def _import(path: Path):
    spec = importlib.util.spec_from_file_location("exported_model_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_search_winner_exports_and_reproduces_tracked_logits(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--strategy", "random", "--trials", "1", "train.max_epochs=2", *TINY, "search.baselines=[dlrm]"]) == 0
    parent = capsys.readouterr().out.split("MLflow search run: ")[1].split()[0]
    assert main(["export", parent, "-o", str(env / "exported"), *TINY]) == 0
    exported = _import(env / "exported" / "model.py").load(str(env / "exported"))

    from rankitect.track import Tracker

    files = Tracker().fetch_model_files(parent, env / "fetched")
    arch = Architecture.from_json((env / "exported" / "genotype.json").read_text())
    assert arch.hash == Architecture.from_json(files.genotype.read_text()).hash
    data = open_data("synthetic", rows=8000)
    model = build_model(arch, data.spec)
    model.load_state_dict(torch.load(files.weights, weights_only=True))
    model.eval()
    batch = next(data.split("test").batches(64, shuffle=False))
    with torch.no_grad():
        expected = model(batch)
        got = exported(batch.dense, batch.sparse_ids())
    assert (got - expected).abs().max().item() <= 1e-6


def test_finetune_reports_before_after_and_never_keeps_worse_weights(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 250 steps of 64 stay within one epoch: no overfitting (data.rows once: a repeated key is an error)
    more = [*(a for a in TINY if not a.startswith("data.rows=")), "data.rows=20000"]
    assert main(["train", "--arch", "baseline:dlrm", "--steps", "60", *more, "train.val_every=30"]) == 0
    run = _run_id(capsys.readouterr().out)
    rest = [a for a in TINY if not a.startswith("data.")]
    assert main(["finetune", run, "--steps", "200", "train.val_every=50", *rest]) == 0  # the run's own 20000 rows
    out = capsys.readouterr().out
    assert "fine-tuning improved validation NE" in out or "the run keeps the starting weights" in out, out
    line = next(l for l in out.splitlines() if l.startswith("val/ne"))
    before, after = map(float, line.split()[1:3])
    assert after <= before, out  # the kept weights: the best validated state, or the start
    from mlflow import MlflowClient

    new = _run_id(out)
    tags = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(new).data.tags
    assert tags["rankitect.finetuned_from"] == run


def test_export_of_run_without_weights_is_a_clear_error(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rankitect.track import Tracker

    Tracker()  # the store exists; the run does not
    assert main(["export", "0123abcd", "-o", str(env / "x"), *TINY]) == 2
    assert "0123abcd" in capsys.readouterr().err
