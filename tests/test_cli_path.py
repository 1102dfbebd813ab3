"""The user's path through the command line: overrides anywhere, hints that name the store, commands
on a run that use the data the run was trained on, and `rankitect ui` stopping its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from rankitect.cli import main
from tests.learnable import learnable_source

# small, yet enough for the training protocol: validation NE below 1 within two epochs
TINY = ["train.batch_size=64", "train.test_batches=2", "search.pruning=none", "runtime.threads=1", "search.workers=1"]


@pytest.fixture()
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict:
    """A DLRM trained on 8000 synthetic rows into a store outside the working directory."""
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    argv = ["train", "--arch", "baseline:dlrm", "train.max_epochs=2", "data.rows=8000", f"track.uri={uri}", *TINY]
    assert main(argv) == 0
    out = capsys.readouterr().out
    return {"uri": uri, "run": out.split("MLflow run: ")[1].split()[0], "work": work}


def test_runs_takes_the_store_override_before_or_after_a_run_id(trained: dict, capsys) -> None:
    uri, run = trained["uri"], trained["run"]
    assert main(["runs", f"track.uri={uri}"]) == 0
    assert "no runs" in capsys.readouterr().out  # a lone train run is no search; no traceback
    child = MlflowClient(uri).get_run(run)
    assert child.data.params["data.rows"] == "8000"
    for argv in (["runs", f"track.uri={uri}", "-v"], ["-v", "runs", f"track.uri={uri}"]):
        assert main(argv) == 0
    assert not (trained["work"] / "mlruns").exists()  # nothing was created where the command ran


def test_reading_commands_never_create_a_store(trained: dict, capsys) -> None:
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert "no run store at" in err and str(trained["work"]) in err
    assert main(["export", trained["run"], "-o", "x"]) == 2
    assert not (trained["work"] / "mlruns").exists() and not (trained["work"] / "x").exists()


def test_finetune_uses_the_runs_data_and_refuses_other_data(trained: dict, capsys) -> None:
    uri, run = trained["uri"], trained["run"]
    # the default data.rows is 200000: without an override finetune must still use the run's 8000
    assert main(["finetune", run, f"track.uri={uri}", "--steps", "4", *TINY]) == 0
    out = capsys.readouterr().out
    new = out.split("MLflow run: ")[1].split()[0]
    ran = MlflowClient(uri).get_run(new)
    assert ran.data.params["data.rows"] == "8000"
    assert ran.data.tags["mlflow.parentRunId"] == run  # nested under its source
    assert f"track.uri={uri}" in out  # the hint names the store
    assert "fine-tuning" in out and "before" in out and "after" in out
    assert main(["finetune", run, f"track.uri={uri}", "data.rows=5000", *TINY]) == 2
    err = capsys.readouterr().err
    assert "data.rows=5000" in err and "data.rows=8000" in err and run in err
    assert main(["probe", run, f"track.uri={uri}", "data.rows=5000", *TINY]) == 2
    assert "data.rows=8000" in capsys.readouterr().err
    assert main(["probe", f"track.uri={uri}", run, "--batches", "1", *TINY]) == 0


def test_search_hints_name_a_store_that_is_not_the_default(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "work"  # a scratch directory: the search must leave it empty
    work.mkdir()
    monkeypatch.chdir(work)
    uri = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    # Two candidates: a random one (its recipe drawn too) may fail on this tiny data; one finishes.
    argv = ["search", f"track.uri={uri}", "--strategy", "random", "--trials", "2", "train.max_epochs=2",
            f"data.source={learnable_source()}",
            "search.baselines=[]", *TINY]
    assert main(argv) == 0
    captured = capsys.readouterr()
    hint = captured.out.split("MLflow search run: ")[1]
    assert hint.count(f"track.uri={uri}") == 3  # runs, export and ui
    assert "best genotype: " in captured.out and '"blocks"' not in captured.out  # a path, not the JSON
    # the search-level status: off a terminal, plain lines beside the trial lines, no carriage return
    assert "search 2/2: done " in captured.out and "\r" not in captured.out + captured.err
    assert "Warning" not in captured.err and "INFO" not in captured.err  # third-party chatter is off

    # the winner is a logged MLflow model that scores raw feature columns like the trained network
    import mlflow
    import pandas as pd
    import torch

    from rankitect.data import open_data
    from rankitect.export.exporter import read_state_dict
    from rankitect.space import Architecture, build_model
    from rankitect.track import Tracker

    model_uri = captured.out.split("mlflow.pyfunc.load_model('")[1].split("'")[0]
    files = Tracker(uri).fetch_model_files(hint.split()[0], tmp_path / "fetched")
    data = open_data(learnable_source())
    batch = data.split("test").take(np.arange(6))
    rows = pd.DataFrame({f.name: batch.dense[:, j].tolist() for j, f in enumerate(data.spec.dense)}
                        | {f.name: batch.sparse_ids()[:, j].tolist() for j, f in enumerate(data.spec.sparse)})
    mlflow.set_tracking_uri(uri)
    try:
        logged_model = mlflow.pyfunc.load_model(model_uri)
        got = logged_model.predict(rows)
        first = rows.columns[0]
        with pytest.raises(ValueError, match=f"row 0: unknown column '{first}x'"):
            logged_model.predict(rows.rename(columns={first: f"{first}x"}))
        with pytest.raises(ValueError, match=f"row 0: no column '{first}'"):
            logged_model.predict(rows.drop(columns=[first]))
        # the opt-in: an absent column is scored as the missing value an empty field is
        absent = logged_model.predict(rows.drop(columns=[first]), params={"allow_missing": True})
        assert absent == logged_model.predict(rows.assign(**{first: None}))
    finally:
        mlflow.set_tracking_uri(None)
    net = build_model(Architecture.from_json(files.genotype.read_text()), data.spec)
    net.load_state_dict(read_state_dict(files.weights))
    with torch.no_grad():
        expected = torch.sigmoid(net.eval()(batch))
    assert torch.allclose(torch.tensor(got), expected, atol=1e-6)
    # the logged model and every artifact live under the store, in the search's experiment
    assert sorted(p.name for p in work.iterdir()) == []
    client = MlflowClient(uri)
    logged = client.search_logged_models(experiment_ids=[e.experiment_id for e in client.search_experiments()])
    assert [m.experiment_id for m in logged] == [client.get_experiment_by_name("rankitect").experiment_id]
    assert Path(logged[0].artifact_location.removeprefix("file://")).is_relative_to(tmp_path / "elsewhere")


GROUP = """
import os, signal, subprocess, sys
# a server that starts a worker which ignores SIGTERM (as uvicorn workers mid-shutdown can)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
child.wait()
"""


def _start_group(runner: str, pids: Path) -> tuple[subprocess.Popen, int, int]:
    """Start ``runner`` (a ``serve_ui`` call) and wait until its group wrote both pids to ``pids``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", runner], env=env)
    deadline = time.monotonic() + 120
    while not (pids.is_file() and len(pids.read_text().split()) == 2):  # the group is up
        assert proc.poll() is None and time.monotonic() < deadline, "the server group did not start"
        time.sleep(0.05)
    server, worker = map(int, pids.read_text().split())
    return proc, server, worker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_ui_server_group_is_stopped_on_sigterm_and_sigint(tmp_path: Path, sig: int) -> None:
    pids = tmp_path / "pids"
    runner = ("import sys; from rankitect.track.location import serve_ui; "
              f"sys.exit(serve_ui([sys.executable, '-c', {GROUP!r}, {str(pids)!r}], dict(__import__('os').environ)))")
    proc, server, worker = _start_group(runner, pids)
    os.kill(proc.pid, sig)  # the command alone, as a service manager or Ctrl-C in a terminal would
    assert proc.wait(timeout=60) == 0
    assert not _running(server) and not _running(worker)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left for init to reap is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pids: list[int], timeout: float) -> bool:
    """Whether every pid has ended within ``timeout`` seconds (a bounded retry on the real condition)."""
    deadline = time.monotonic() + timeout
    while any(_running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_ui_server_group_ends_when_the_command_is_killed_with_sigkill(tmp_path: Path) -> None:
    """`kill -9` of the command runs no handler of its own: the group's leader sees its pipe close
    and stops the server, and the worker that ignores SIGTERM is killed after the grace period."""
    pids = tmp_path / "pids"
    runner = ("import sys; from rankitect.track import location; location.STOP_GRACE_S = 1.0; "
              f"sys.exit(location.serve_ui([sys.executable, '-c', {GROUP!r}, {str(pids)!r}], dict(__import__('os').environ)))")
    proc, server, worker = _start_group(runner, pids)
    group = os.getpgid(server)
    assert group != os.getpgid(proc.pid) and os.getpgid(worker) == group  # a process group of its own
    proc.kill()
    proc.wait()
    assert _gone([server, worker], timeout=60), "the UI server outlived `kill -9` of its command"


def test_ui_refuses_a_busy_port_and_a_store_that_does_not_exist(tmp_path: Path, capsys) -> None:
    import socket

    from rankitect.track import Tracker

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    Tracker(uri)
    with socket.socket() as other:  # another server holds the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["ui", "--port", str(port), f"track.uri={uri}"]) == 2
    captured = capsys.readouterr()
    assert f"port {port}" in captured.err and "in use" in captured.err and "http://" not in captured.out
    missing = tmp_path / "nowhere" / "mlflow.db"
    assert main(["ui", "--port", str(port), f"track.uri=sqlite:///{missing}"]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not missing.parent.exists()  # ui creates no store


@pytest.mark.parametrize("verbose", [False, True])
def test_ui_is_quiet_unless_verbose(tmp_path: Path, monkeypatch, capsys, verbose: bool) -> None:
    """Without -v the server is started without its request log and with warnings off; with -v as is."""
    import socket

    from rankitect.track import Tracker, location

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    Tracker(uri)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(location, "serve_ui", lambda argv, env: started.append((argv, env)) or 0)
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    assert main(["ui", "--port", str(port), f"track.uri={uri}", *(["-v"] if verbose else [])]) == 0
    (argv, env), = started
    assert ("--no-access-log" in " ".join(argv)) is not verbose
    assert (env.get("PYTHONWARNINGS") == "ignore") is not verbose
    assert f"http://127.0.0.1:{port}/" in capsys.readouterr().out
