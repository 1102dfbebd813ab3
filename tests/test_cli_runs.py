"""`rankitect runs`: searches told apart by strategy, data and start; a search's trials with the
winner marked and pruned trials called pruned; a table as wide as the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankitect.cli import main
from rankitect.eval.pareto import pareto_table
from rankitect.eval.result import TrialResult
from rankitect.track import Tracker
from tests.search.toy import ToyArch


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two searches on different data in one store: one with a candidate winner, pruned and failed
    trials; one whose winner is a baseline."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('runs')}/mlflow.db"
    tracker = Tracker(uri)
    first = tracker.start_search({"data": {"source": "/srv/data/adult.csv"}}, "evolution", "engineer")
    archs = [ToyArch((8,), "relu"), ToyArch((16, 32), None), ToyArch((4,), "relu"), ToyArch((2,), None)]
    results = [TrialResult(val_ne=0.80, test_ne=0.82, test_auc=0.71, test_logloss=0.45, mflops=0.5, params=80,
                           train_seconds=1.5),
               TrialResult(val_ne=0.75, test_ne=0.76, test_auc=0.74, test_logloss=0.43, mflops=2.0, params=480,
                           train_seconds=2.5),
               TrialResult.pruning("hopeless", val_ne=0.95, mflops=1.0, params=10, train_seconds=0.5, steps=4),
               TrialResult.failure("loss is NaN at step 40", mflops=9.0)]
    ids = {a.hash: tracker.log_trial(first, a, r) for a, r in zip(archs, results)}
    base = TrialResult(val_ne=0.78, test_ne=0.79, test_auc=0.72, test_logloss=0.44, mflops=1.0, params=100,
                       train_seconds=3.0)
    ids["dlrm"] = tracker.log_trial(first, ToyArch((32,), "relu"), base, baseline="dlrm")
    tracker.finish_search(first, pareto_table(zip(archs, results), {"dlrm": base}), archs[1], {})
    second = tracker.start_search({"data": {"source": "synthetic"}}, "dnas", "engineer")
    tracker.log_trial(second, archs[0], results[0])
    ids["dlrm2"] = tracker.log_trial(second, ToyArch((32,), "relu"), base, baseline="dlrm")
    tracker.finish_search(second, pareto_table([(archs[0], results[0])], {"dlrm": base}, winner=("baseline", "dlrm")),
                          ToyArch((32,), "relu"), {})
    return {"uri": uri, "first": first, "second": second, "archs": archs, "ids": ids}


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.rstrip("\n").splitlines()


def _row(lines: list[str], name: str) -> list[str]:
    (row,) = [line.split() for line in lines if name in line.split()]
    return row


def test_searches_are_told_apart_by_strategy_data_and_start(store: dict, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["runs", f"track.uri={store['uri']}"]) == 0
    lines = _lines(capsys)
    header = lines[0].split()
    assert header[:3] == ["run_id", "name", "data"] and "winner" in header
    first = dict(zip(header, _row(lines, store["first"])))
    second = dict(zip(header, _row(lines, store["second"])))
    assert first["name"].startswith("evolution-engineer-adult-") and first["data"] == "adult.csv"
    assert second["name"].startswith("dnas-engineer-synthetic-") and second["data"] == "synthetic"
    assert first["winner"] == store["archs"][1].hash and second["winner"] == "dlrm"
    assert lines[1].split()[0] == store["second"]  # newest first


def test_a_searchs_trials_mark_the_winner_and_call_pruned_trials_pruned(store: dict, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["runs", store["first"], f"track.uri={store['uri']}"]) == 0
    lines = _lines(capsys)
    header = lines[0].split()
    rows = {r[0]: dict(zip(header, r)) for r in (line.split() for line in lines[1:])}
    winner, pruned, failed = store["archs"][1].hash, store["archs"][2].hash, store["archs"][3].hash
    assert [n for n, r in rows.items() if r.get("winner") == "*"] == [winner]
    assert rows[pruned]["status"] == "pruned" and rows[failed]["status"] == "failed"
    assert "KILLED" not in " ".join(lines) and "FINISHED" not in " ".join(lines)
    assert {"run_id", "val/ne", "test/ne", "mflops", "genotype_hash"} <= set(header)  # wide: every column
    assert main(["runs", store["second"], f"track.uri={store['uri']}"]) == 0
    lines = _lines(capsys)
    assert _row(lines, "dlrm")[lines[0].split().index("winner")] == "*"  # a baseline winner is marked too


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_the_table_is_as_wide_as_the_terminal(store: dict, capsys, monkeypatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    for argv in (["runs"], ["runs", store["first"]]):
        assert main([*argv, f"track.uri={store['uri']}"]) == 0
        lines = _lines(capsys)
        assert max(map(len, lines)) <= columns, "\n".join(lines)
        assert len(lines[0].split()) >= 2  # the run id and name stay
    assert "name" in lines[0] and "status" in lines[0]  # a search's trials keep their status at 60 columns
