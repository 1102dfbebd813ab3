"""Bad input is refused before any work: exit 2, one line naming the key (or file) and what is
allowed, and nothing written (no data cache, no run store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankitect.cli import main


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _error_line(err: str) -> str:
    """The one error line a refused command prints (progress bars of data it read may precede it)."""
    lines = [ln for ln in err.strip().replace("\r", "\n").splitlines() if ln.startswith("rankitect:")]
    assert len(lines) == 1 and lines[0].startswith("rankitect: error: ") and "Traceback (most recent" not in err, err
    assert err.strip().endswith(lines[0]), err
    return lines[0]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], root: Path) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankitect: error: "), err
    assert not (root / "cache").exists() and not (root / "mlruns").exists()  # nothing read or written
    return lines[0]


@pytest.mark.parametrize(("argv", "says"), [
    (["search", "train.steps=0"], "'train.steps' must be >= 1, got 0"),
    (["search", "search.trials=-1"], "'search.trials' must be >= 1, got -1"),
    (["search", "--workers", "0"], "'search.workers' must be >= 1, got 0"),
    (["search", "train.batch_size=0"], "'train.batch_size' must be >= 1, got 0"),
    (["search", "train.lr_dense=-1"], "'train.lr_dense' must be > 0, got -1.0"),
    (["search", "data.rows=0"], "'data.rows' must be >= 100, got 0"),
    (["search", "data.rows=-5"], "'data.rows' must be >= 100, got -5"),
    (["search", "search.evolution.population=0"], "'search.evolution.population' must be >= 1, got 0"),
    (["train", "--arch", "baseline:dlrm", "train.steps=0"], "'train.steps' must be >= 1, got 0"),
    (["data", "synth", "--rows", "0"], "'data.rows' must be >= 100, got 0"),
])
def test_wrong_numbers_are_refused_naming_key_and_range(sandbox: Path, capsys, argv: list[str], says: str) -> None:
    assert says in _refused(argv, capsys, sandbox)


def test_unknown_strategy_and_space_list_every_registered_name(sandbox: Path, capsys) -> None:
    from rankitect.search.base import STRATEGIES
    from rankitect.space import SPACES

    line = _refused(["search", "--strategy", "evolutoin"], capsys, sandbox)
    for name in [*STRATEGIES, "oneshot", "dnas"]:
        assert repr(name) in line
    line = _refused(["search", "--space", "nasrek"], capsys, sandbox)
    assert "'nasrek'" in line and all(repr(name) in line for name in SPACES)


def _one_request_csv(folder: Path, rows: int) -> Path:
    """``rows`` rows of one request: all of them hash to one split, so at least two are empty."""
    rng = np.random.default_rng(0)
    pd.DataFrame({"y": rng.integers(0, 2, rows), "a": rng.integers(0, 5, rows), "rid": ["r0"] * rows}).to_csv(
        folder / "one.csv", index=False)
    (folder / "s.yaml").write_text("label: y\nsparse: [a]\nrequest_id: rid\n")
    return folder / "one.csv"


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("command", [["data", "inspect", "-c", "run.yaml"], ["train", "--arch", "baseline:dlrm"], ["search"]])
def test_a_data_set_with_an_empty_split_is_refused_by_every_command(sandbox: Path, capsys, command, rows) -> None:
    csv = _one_request_csv(sandbox, rows)
    (sandbox / "run.yaml").write_text(f"data:\n  source: {csv}\n  schema: {sandbox / 's.yaml'}\n")
    argv = [*command, f"data.source={csv}", f"data.schema={sandbox / 's.yaml'}", "runtime.threads=1", "search.workers=1"]
    if command[0] == "data":
        argv = command
    code = main(argv)
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and str(csv) in err and "split" in err and "empty" in err
    assert not (sandbox / "mlruns").exists()


def test_batch_stream_refuses_an_empty_split_instead_of_spinning(sandbox: Path) -> None:
    from rankitect.data import open_data
    from rankitect.train.loop import BatchStream

    data = open_data("synthetic", rows=200, seed=0)
    empty = data.split("train")
    empty.labels = empty.labels[:0]  # the stream asks the split for its length and its batches
    with pytest.raises(ValueError, match="train split has no rows"):
        next(iter(BatchStream(empty, 8, shuffle=True, seed=0, repeat=True)))


def _hostile_genotype(folder: Path, activation: str) -> Path:
    from rankitect.space.baselines import get_baseline
    from rankitect.space.testing import tiny_spec

    d = get_baseline("dlrm", tiny_spec()).to_dict()
    d["blocks"][0]["params"]["activation"] = activation
    path = folder / "hostile.json"
    path.write_text(__import__("json").dumps(d))
    return path


@pytest.mark.parametrize("activation", ['__import__("os").system("touch pwned")', "relu\nrankitect: error: forged"])
def test_a_hostile_genotype_value_is_one_line_naming_the_file(sandbox: Path, capsys, activation: str) -> None:
    path = _hostile_genotype(sandbox, activation)
    code = main(["train", "--arch", str(path), "data.rows=300", "train.steps=1", "runtime.threads=1", "search.workers=1"])
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and str(path) in err and "unknown activation" in err
    assert not (sandbox / "pwned").exists() and not (sandbox / "mlruns").exists()


def _run_with_weights(root: Path, weights: bytes) -> str:
    """A tracked dlrm run whose kept weights file holds ``weights``."""
    from rankitect.data import open_data
    from rankitect.eval.result import TrialResult
    from rankitect.space.baselines import get_baseline
    from rankitect.track import Tracker

    data = open_data("synthetic", rows=300, seed=0)
    tracker = Tracker()
    run_id = tracker.log_trial(None, get_baseline("dlrm", data.spec), TrialResult.from_metrics({"val/ne": 0.9}, mflops=1.0))
    (root / "model.safetensors").write_bytes(weights)
    data.spec.save(root / "spec.json")
    tracker.log_model_files(run_id, root / "model.safetensors", root / "spec.json")
    return run_id


@pytest.mark.parametrize("command", [["finetune", "--steps", "1"], ["probe"], ["export", "-o", "out"]])
def test_unreadable_kept_weights_are_one_line(sandbox: Path, capsys, command: list[str]) -> None:
    run_id = _run_with_weights(sandbox, b"\x80\x04not weights at all")
    code = main([command[0], run_id, *command[1:], "data.rows=300", "runtime.threads=1", "search.workers=1"])
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and "cannot read weights" in err and "model.safetensors" in err


@pytest.mark.parametrize("target", ["a_file", "a_file/below"])
def test_a_bad_export_target_is_one_line(sandbox: Path, capsys, target: str) -> None:
    from rankitect.data import open_data
    from rankitect.space import build_model
    from rankitect.space.baselines import get_baseline
    from rankitect.track.weights import save_weights

    spec = open_data("synthetic", rows=300, seed=0).spec
    run_id = _run_with_weights(sandbox, b"")
    save_weights(build_model(get_baseline("dlrm", spec), spec).state_dict(), sandbox / "model.safetensors")
    from rankitect.track import Tracker

    Tracker().log_model_files(run_id, sandbox / "model.safetensors", sandbox / "spec.json")
    (sandbox / "a_file").write_text("keep me\n")
    code = main(["export", run_id, "-o", str(sandbox / target)])
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and str(sandbox / target) in err and (sandbox / "a_file").read_text() == "keep me\n"


@pytest.mark.parametrize(("argv", "says"), [
    (["search", "search.baselines=[nosuch]"], "'search.baselines': unknown baseline 'nosuch'; known: ['autoint',"),
    (["search", "search.baselines=[dlrm,dcnv2,dlrm]"], "'search.baselines': 'dlrm' is listed twice"),
    (["search", "runtime.device=tpu"], "'runtime.device': unknown device 'tpu'; valid: 'cpu', 'cuda', 'cuda:N'"),
    (["train", "--arch", "baseline:dlrm", "runtime.device=tpu"], "unknown device 'tpu'"),
    (["search", "search.flops_range=[5,1]"], "'search.flops_range': must be 'auto', null or [low, high] MFLOPs with "
                                             "0 < low < high, got [5.0, 1.0]"),
    (["search", "search.flops_range=[0,1]"], "0 < low < high, got [0.0, 1.0]"),
])
def test_wrong_names_devices_and_ranges_are_refused_before_any_run(sandbox: Path, capsys, argv, says) -> None:
    assert says in _refused(argv, capsys, sandbox)


@pytest.mark.parametrize(("override", "key"), [
    ("search.output_dir={root}/a_file", "search.output_dir"),
    ("search.output_dir={root}/a_file/below", "search.output_dir"),
    ("track.uri=sqlite:///{root}/a_file/mlflow.db", "track.uri"),
])
def test_a_search_that_could_not_write_is_refused_before_any_work(sandbox: Path, capsys, override: str, key: str) -> None:
    (sandbox / "a_file").write_text("keep me\n")
    line = _refused(["search", "data.rows=300", override.format(root=sandbox)], capsys, sandbox)
    assert f"config key {key!r}" in line and f"{sandbox / 'a_file'} is a file" in line
    assert (sandbox / "a_file").read_text() == "keep me\n"


@pytest.mark.parametrize(("override", "key"), [
    ("search.output_dir=/sys/rankitect-search", "search.output_dir"),
    ("track.uri=sqlite:////sys/rankitect-runs/mlflow.db", "track.uri"),
])
def test_a_search_on_a_folder_no_one_may_write_is_refused(sandbox: Path, capsys, override: str, key: str) -> None:
    """sysfs refuses new files to every user, root included (a chmod does not stop root)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("/sys is writable here")
    except OSError:
        pass
    line = _refused(["search", "data.rows=300", override], capsys, sandbox)
    assert f"config key {key!r}: cannot write under /sys" in line


def test_a_refusal_after_the_search_run_opened_ends_it_failed_with_the_reason(sandbox: Path, capsys) -> None:
    """A supernet over runtime.memory_budget is refused once the search run exists (the strategy
    starts after the baselines): the run ends FAILED, its tag says why, nothing stays RUNNING."""
    from mlflow import MlflowClient

    code = main(["search", "--strategy", "oneshot", "data.rows=300", "search.baselines=[]", "runtime.threads=1", "search.workers=1",
                 "runtime.memory_budget=0.000001"])
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and "runtime.memory_budget" in err
    client = MlflowClient(f"sqlite:///{sandbox}/mlruns/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "runtime.memory_budget" in runs[0].data.tags["rankitect.failure"]
