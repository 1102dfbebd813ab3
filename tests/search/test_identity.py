"""One search is one experiment: a resume or a process joining a shared search with other data,
another space or another strategy is refused (exit 2, naming the key and both values), and the
processes of one shared search rank every trial by one objective."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from rankitect.cli import main
from rankitect.config import load_config
from rankitect.search.running.runner import SearchRunner

from tests.learnable import learnable_source
from .tiny_data import tiny_click_data
from .together import start_together

TINY = ["train.steps=1", "train.batch_size=64", "train.val_every=1", "train.val_batches=1", "train.test_batches=1",
        "runtime.threads=1", "search.workers=1", "search.baselines=[]", "search.strategy=evolution", "search.pruning=none",
        "search.trials=1"]
SYNTHETIC = ["data.rows=3000", *TINY]


def _client():
    from mlflow import MlflowClient

    return MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def _search_runs() -> list:
    c = _client()
    exp = [e.experiment_id for e in c.search_experiments()]
    return list(c.search_runs(exp, "tags.`rankitect.kind` = 'search'")) if exp else []


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("rankitect:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _finished_search(capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    assert main(["search", *overrides]) == 0
    out = capsys.readouterr().out
    return out.split("MLflow search run: ")[1].split()[0]


CHANGES = [  # (what the resume changes, the key named, its value here, its value in the search)
    (["data.rows=3100"], "data.rows", "3100", "3000"),
    (["data.seed=5"], "data.seed", "5", "0"),
    (["search.space=nasrec"], "search.space", "'nasrec'", "'engineer'"),
    (["--strategy", "tpe"], "search.strategy", "'tpe'", "'evolution'"),
    (["train.lr_dense=0.01"], "train.lr_dense", "0.01", "0.001"),
]


def test_a_resume_with_other_data_space_or_strategy_is_refused(
    env: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    parent = _finished_search(capsys, *SYNTHETIC)
    state = Path(_client().get_run(parent).data.tags["rankitect.checkpoint"])
    before = state.read_text()
    for change, key, here, there in CHANGES:
        line = _refused(["search", "--resume", parent, *change], capsys)
        assert f"{key} is {here} here but {there} in the search" in line and parent in line, line
        assert state.read_text() == before and _client().get_run(parent).info.status == "FINISHED"
    # a plain resume still works (the refused ones switched nothing), and the budget may grow
    assert main(["search", "--resume", parent, "search.trials=2", "search.workers=1"]) == 0
    assert len(json.loads(state.read_text())["trials"]) == 2


def test_a_resume_on_other_data_of_the_same_settings_is_refused(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A data directory is compared by what it holds, not by its path: another set of rows is
    refused, a copy of the same rows elsewhere is not."""
    import shutil

    first, other = tiny_click_data(tmp_path / "a", seed=0), tiny_click_data(tmp_path / "b", seed=1)
    parent = _finished_search(capsys, *TINY, f"data.source={first.path}")
    line = _refused(["search", "--resume", parent, f"data.source={other.path}"], capsys)
    assert "data.splits is 'train 1024 rows" in line and "but 'train 1024 rows" in line, line
    shutil.copytree(first.path, tmp_path / "copy")
    assert main(["search", "--resume", parent, f"data.source={tmp_path / 'copy'}"]) == 0


def test_a_process_with_other_data_is_refused_by_a_shared_search(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    shared = [f"search.storage=sqlite:///{tmp_path}/study.db", "search.study_name=s"]
    owner = SearchRunner(load_config(overrides=[*SYNTHETIC, *shared]), echo=lambda s: None)  # the search's run
    line = _refused(["search", "data.rows=3100", *TINY, *shared], capsys)
    assert "data.rows is 3100 in this process but 3000 in the search" in line, line
    line = _refused(["search", "data.rows=3000", *[o for o in TINY if not o.startswith("search.strategy=")], *shared,
                     "search.strategy=random"], capsys)
    assert "search.strategy is 'random' in this process but 'evolution'" in line, line
    assert [r.info.run_id for r in _search_runs()] == [owner.state.parent_run_id]  # the refused opened none
    # other rows behind the same settings: refused by what was read
    a, b = tiny_click_data(tmp_path / "a", seed=0), tiny_click_data(tmp_path / "b", seed=1)
    files = [*TINY, f"search.storage=sqlite:///{tmp_path}/files.db", "search.study_name=f"]
    SearchRunner(load_config(overrides=[*files, f"data.source={a.path}"]), echo=lambda s: None)
    line = _refused(["search", *files, f"data.source={b.path}"], capsys)
    assert "data.splits is" in line and "in this process but" in line, line
    assert len(_search_runs()) == 2


PROCESSES = 4
LEARNABLE = ["train.max_epochs=2", "train.grace_steps=33", "train.batch_size=64", "train.val_batches=2",
             "train.test_batches=2", "runtime.threads=1", "search.workers=1", "search.pruning=none"]


@pytest.mark.slow
def test_four_processes_rank_every_trial_by_one_objective(env: dict[str, str], tmp_path: Path) -> None:
    """Released together, three processes reach the ranking while the first still trains the
    baselines: they wait for the target it resolves, so every process (and the Pareto table the
    last one writes) gives every trial the same objective, NE x (1 + w max(0, log2(F / F0)))."""
    argv = ["search", "--strategy", "random", "--trials", "4", "--storage", f"sqlite:///{tmp_path}/study.db",
            "--study-name", "s", f"data.source={learnable_source()}", *LEARNABLE, "search.baselines=[dlrm,dcnv2]"]
    procs = start_together([argv] * PROCESSES, env, tmp_path)
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    lines = [line for out, _ in outs for line in out.splitlines() if line.startswith("target_mflops auto:")]
    assert len(lines) == PROCESSES and not any("no baseline finished" in t for t in lines), lines
    targets = {float(line.split()[2]) for line in lines}  # "target_mflops auto: 1.2345 MFLOPs (...)"
    assert len(targets) == 1, lines
    target = targets.pop()
    parent = outs[0][0].split("search run ")[1].split(":")[0]
    folder = Path(_client().get_run(parent).data.tags["rankitect.checkpoint"]).parent
    table = pd.read_csv(folder / "pareto.csv")
    ok = table[table["status"] == "ok"]
    assert {"dlrm", "dcnv2"} <= set(ok["name"]) and len(table) == 6
    for _, row in ok.iterrows():  # the textbook penalty at the owner's target (relaxed, weight 0.01)
        expected = row["val_ne"] * (1 + 0.01 * max(0.0, math.log2(row["mflops"] / target)))
        assert row["objective"] == pytest.approx(expected, rel=1e-3, abs=1e-4), row["name"]
    printed = [_objectives(out) for out, _ in outs]
    assert any(set(mine) == set(ok["name"]) for mine in printed)  # the last to finish has them all
    for mine in printed:
        assert {"dlrm", "dcnv2"} <= set(mine) <= set(ok["name"])  # the others, what had finished by then
        for name, value in mine.items():
            assert value == pytest.approx(ok.set_index("name").loc[name, "objective"], abs=1e-4), name


def _objectives(out: str) -> dict[str, float]:
    """``{name: objective}`` of the ok rows of the table a search prints."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["name", "kind"])
    cols = lines[head].split()
    rows = {}
    for ln in lines[head + 1:]:
        cells = ln.split()
        if len(cells) != len(cols):
            break
        row = dict(zip(cols, cells))
        if row["status"] == "ok":
            rows[row["name"]] = float(row["objective"])
    return rows


def test_the_resume_hint_of_a_stopped_search_names_its_store(env: dict[str, str], tmp_path: Path) -> None:
    import signal

    from rankitect.signals import Stopped

    said: list[str] = []
    uri = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"  # not the working directory's default store
    runner = SearchRunner(load_config(overrides=[*SYNTHETIC, f"track.uri={uri}"]), echo=said.append)
    from rankitect.track.location import store_args

    said.append(runner.recorder.stop(Stopped(signal.SIGTERM), store_args(runner.tracker.uri), owner=runner.owner))
    assert said[-1].endswith(f"rankitect search --resume {runner.state.parent_run_id} track.uri={uri}"), said


def test_every_key_that_may_change_is_a_config_key() -> None:
    """MAY_CHANGE names keys (or sections, ending in "."); a renamed key left behind would silently
    make its new name part of the identity."""
    from rankitect.config import Config
    from rankitect.config_rules import flatten, to_dict
    from rankitect.search.running.identity import MAY_CHANGE, config_identity

    keys = flatten(to_dict(Config()))
    for name in MAY_CHANGE:
        assert name in keys or (name.endswith(".") and any(k.startswith(name) for k in keys)), name
    identity = config_identity(Config())
    assert "search.dnas.supernet.steps" in identity and "search.dnas.supernet.top_k" not in identity
