"""The quality bench reads a search as its user would and runs strategies at equal wall clock.

The searches themselves run in processes of their own (minutes: ``--quick`` is not in
tests/test_bench.py's quick list); here the bench's reading, its arithmetic over seeds and its order
of work are checked on Pareto tables written by :func:`rankitect.eval.pareto.pareto_table`, the
function a search writes ``pareto.csv`` with, against hand-computed references.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.quality import quality_bench, quality_report
from rankitect.eval.pareto import pareto_table


def result(val_ne: float, test_ne: float, mflops: float, status: str = "ok") -> SimpleNamespace:
    return SimpleNamespace(status=status, val_ne=val_ne, test_ne=test_ne, test_auc=0.7, test_logloss=0.4,
                           mflops=mflops, params=10)


def write_search(folder: Path, baselines: dict[str, SimpleNamespace], cands: dict[str, SimpleNamespace],
                 winner: tuple[str, str], elapsed: float) -> None:
    """A search folder as the runner leaves it: ``<run id>/pareto.csv`` and ``state.json``."""
    run = folder / "0123abcd"
    run.mkdir(parents=True)
    pareto_table(cands.items(), baselines, winner=winner).to_csv(run / "pareto.csv", index=False)
    (run / "state.json").write_text(json.dumps({"elapsed": elapsed, "trials": []}))


BASES = {"dlrm": result(0.80, 0.79, 1.0), "dcnv2": result(0.78, 0.80, 2.0),  # dcnv2: best on validation
         "deepfm": result(math.nan, math.nan, 1.5, status="failed")}


def record(tmp: Path, strategy: str, seed: int, cands: dict[str, SimpleNamespace], winner: tuple[str, str],
           bases: dict[str, SimpleNamespace] = BASES) -> dict[str, Any]:
    folder = tmp / f"{strategy}-{seed}"
    write_search(folder, bases, cands, winner, elapsed=100.0 + seed)
    return {"data": "d", "seed": seed, "strategy": strategy, "wall_s": 120.0, "time_budget": None,
            **quality_report.read_search(folder)}


def test_a_search_is_read_from_its_folder(tmp_path: Path) -> None:
    run = record(tmp_path, "dnas", 0, {"c1": result(0.77, 0.78, 1.5)}, winner=("candidate", "c1"))
    assert run["run_id"] == "0123abcd" and run["search_s"] == 100.0
    assert len(run["table"]) == 4
    base = quality_report.best_baseline(run["table"])
    assert base is not None and base["name"] == "dcnv2"  # lowest validation NE, though dlrm's test NE is lower
    won = quality_report.returned(run["table"])
    assert won is not None and won["name"] == "c1" and won["kind"] == "candidate"
    failed = next(r for r in run["table"] if r["name"] == "deepfm")
    assert failed["val_ne"] is None and failed["test_ne"] is None  # NaN is plain JSON null
    json.dumps(run, allow_nan=False)


def test_rows_and_summary_match_a_hand_computation(tmp_path: Path) -> None:
    # the reference: dcnv2's test NE 0.80 at 2.0 MFLOPs; dnas returns candidates, random a baseline once
    got = {("dnas", 0): ({"c1": result(0.77, 0.784, 1.5)}, ("candidate", "c1")),
           ("dnas", 1): ({"c2": result(0.76, 0.792, 2.5)}, ("candidate", "c2")),
           ("random", 0): ({"c3": result(0.79, 0.81, 0.5)}, ("baseline", "dcnv2")),
           ("random", 1): ({"c4": result(0.75, 0.776, 1.0)}, ("candidate", "c4"))}
    runs = {f"d/{s}/{t}": record(tmp_path, t, s, *v) for (t, s), v in got.items()}
    rows = quality_report.seed_rows(runs)
    by = {(r["strategy"], r["seed"]): r for r in rows}
    assert [(r["strategy"], r["seed"]) for r in rows] == [("dnas", 0), ("random", 0), ("dnas", 1), ("random", 1)]
    assert by["dnas", 0]["diff_pct"] == pytest.approx(100 * (0.784 - 0.80) / 0.80)
    assert by["dnas", 0]["within_flops"] and not by["dnas", 1]["within_flops"]  # 2.5 > 2.0 MFLOPs
    assert by["random", 0]["is_baseline"] and by["random", 0]["diff_pct"] == pytest.approx(0.0)
    assert all(r["baseline"] == "dcnv2" and r["trained"] == 1 for r in rows)

    summary = quality_report.aggregate(rows, "d")
    dnas, random = summary["strategies"]["dnas"], summary["strategies"]["random"]
    assert dnas["test_ne"] == pytest.approx((0.784 + 0.792) / 2)
    assert dnas["test_ne_sd"] == pytest.approx(abs(0.784 - 0.792) / math.sqrt(2))  # sample sd of two values
    assert dnas["diff_pct"] == pytest.approx(100 * ((0.784 + 0.792) / 2 / 0.80 - 1))
    assert dnas["searched_within_flops"] == 1 and dnas["returned_baseline"] == 0
    assert random["searched_within_flops"] == 1 and random["returned_baseline"] == 1
    assert summary["best_baseline"]["test_ne"] == pytest.approx(0.80) and summary["best_baseline"]["test_ne_sd"] == 0
    best_other = (0.80 + 0.776) / 2
    assert summary["dnas_vs_best"] == {"strategy": "random",
                                       "diff_pct": pytest.approx(100 * ((0.784 + 0.792) / 2 / best_other - 1))}


def with_losses(rng: Any, base: Any, shift: float, noise: float, entropy: float, mflops: float) -> tuple[Any, Any]:
    """Per-example validation losses ``base - shift`` plus zero-mean noise of sd ``noise``, and a
    result whose validation NE is their mean over ``entropy`` (as a trial's would be)."""
    e = rng.normal(0.0, noise, len(base)) if noise else 0.0 * base
    losses = base - shift + (e - e.mean())
    return losses, result(float(losses.mean() / entropy), 0.0, mflops)


@pytest.mark.parametrize("clear", [True, False])
def test_the_pick_at_the_target_is_the_rule_among_models_within_the_best_baselines_flops(tmp_path: Path,
                                                                                           clear: bool) -> None:
    """A search that returned a model over the best baseline's FLOPs is also read at the target: the
    winner by its rule among the models at no more than those FLOPs. A cheaper candidate better by
    far more than the noise (about 15 paired standard errors) is that pick; one better on validation
    by a tenth of a standard error is not, and the best baseline is."""
    import numpy as np

    from rankitect.search.judging.standings import ExampleLosses

    rng, h, n = np.random.default_rng(0), 0.6, 4000
    base = rng.exponential(0.5, n)
    losses = {"dcnv2": with_losses(rng, base, 0.0, 0.0, h, 2.0),  # the best baseline by validation NE
              "big": with_losses(rng, base, 0.05, 0.2, h, 4.0),  # the best of all, at twice its FLOPs
              "tie": with_losses(rng, base, 0.0005, 0.3, h, 1.0)}  # z = 0.0005 / (0.3 / sqrt(n)) = 0.1
    if clear:
        losses["good"] = with_losses(rng, base, 0.01, 0.04, h, 1.5)  # z = 0.01 / (0.04 / sqrt(n)) = 16
    bases = {"dcnv2": losses["dcnv2"][1], "dlrm": result(0.95, 0.8, 1.0)}  # dlrm: far worse, kept no losses
    for name, (_, r) in losses.items():
        r.test_ne = {"dcnv2": 0.80, "big": 0.76, "tie": 0.81, "good": 0.78}[name]
    folder = tmp_path / "dnas-0"
    write_search(folder, bases, {k: r for k, (_, r) in losses.items() if k not in bases}, ("candidate", "big"), 100.0)
    for name, (loss, _) in losses.items():
        ExampleLosses(folder / "0123abcd").save(name, loss)
    run = {"data": "d", "seed": 0, "strategy": "dnas", "wall_s": 120.0, "time_budget": None,
           **quality_report.read_search(folder)}
    assert run["at_target"] == ("good" if clear else "dcnv2")
    row = quality_report.seed_rows({"d/0/dnas": run})[0]
    assert row["returned"] == "big" and row["diff_pct"] == pytest.approx(100 * (0.76 / 0.80 - 1))
    assert row["target_returned"] == run["at_target"]
    assert row["target_diff_pct"] == pytest.approx(100 * (0.78 / 0.80 - 1) if clear else 0.0)
    # the best trained at no more than dcnv2's 2.0 MFLOPs by test NE: good (0.78), else tie (0.81); never big
    assert row["trained_best_diff_pct"] == pytest.approx(100 * ((0.78 if clear else 0.81) / 0.80 - 1))


def test_the_summary_compares_dnas_with_the_best_other_strategy_at_the_target_too(tmp_path: Path) -> None:
    """``random`` returns a better model than ``dnas`` but over the FLOPs of the best baseline
    (dcnv2, 2.0 MFLOPs); at no more than them it has only a worse candidate (its pick there is
    that one: the losses were not kept, so the plain rule judges it), and dnas is ahead."""
    runs = {"d/0/dnas": record(tmp_path, "dnas", 0, {"c1": result(0.77, 0.784, 1.5)}, ("candidate", "c1")),
            "d/0/random": record(tmp_path, "random", 0, {"c2": result(0.70, 0.760, 3.0), "c3": result(0.775, 0.792, 1.0)},
                                 ("candidate", "c2"))}
    assert runs["d/0/dnas"]["at_target"] == "c1" and runs["d/0/random"]["at_target"] == "c3"
    summary = quality_report.aggregate(quality_report.seed_rows(runs), "d")
    assert summary["dnas_vs_best"] == {"strategy": "random", "diff_pct": pytest.approx(100 * (0.784 / 0.760 - 1))}
    assert summary["strategies"]["random"]["target_diff_pct"] == pytest.approx(100 * (0.792 / 0.80 - 1))
    assert summary["strategies"]["random"]["trained_best_diff_pct"] == pytest.approx(100 * (0.792 / 0.80 - 1))
    assert summary["dnas_vs_best_at_target"] == {"strategy": "random",
                                                 "diff_pct": pytest.approx(100 * (0.784 / 0.792 - 1))}


def test_dnas_sets_the_clock_and_finished_searches_are_not_run_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(set=[], strategies=["dnas", "random", "tpe"], min_budget=0.0, quick=False)
    results = quality_bench.Results(tmp_path)
    results.put("runs", "d/0/random", record(tmp_path, "random", 0, {"c": result(0.7, 0.7, 1.0)}, ("candidate", "c")))
    calls = []

    def search(self: Any, data: str, seed: int, strategy: str, budget: float | None) -> dict[str, Any] | None:
        calls.append((strategy, budget))
        if strategy == "tpe":
            return None  # a failed search: recorded as failed, run again next time
        return record(tmp_path, strategy, seed, {"c": result(0.7, 0.7, 1.0)}, ("candidate", "c"))

    monkeypatch.setattr(quality_bench.Bench, "search", search)
    quality_bench.Bench(args, tmp_path, results).run_seed("d", 0)
    assert calls == [("dnas", None), ("tpe", 100.0)]  # random was in results.json; tpe got dnas's search seconds
    stored = json.loads((tmp_path / "results.json").read_text())
    assert sorted(stored["runs"]) == ["d/0/dnas", "d/0/random"] and list(stored["failed"]) == ["d/0/tpe"]
    assert stored["summary"]["d"]["strategies"]["dnas"]["search_s"] == 100.0

    calls.clear()
    quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).run_seed("d", 0)
    assert calls == [("tpe", 100.0)]


def recorded_searches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Replace the bench's CLI searches by one that records ``(strategy, budget)`` and returns a
    finished search; returns the list it records into."""
    calls: list[tuple[str, float | None]] = []

    def search(self: Any, data: str, seed: int, strategy: str, budget: float | None) -> dict[str, Any] | None:
        calls.append((strategy, budget))
        return record(tmp_path, strategy, seed, {"c": result(0.7, 0.7, 1.0)}, ("candidate", "c"))

    monkeypatch.setattr(quality_bench.Bench, "search", search)
    return calls


def test_a_search_another_process_claimed_is_left_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two bench processes given the same seeds: the search one of them is running (its claim held)
    is skipped by the other, which goes on to the next."""
    args = argparse.Namespace(set=[], strategies=["dnas", "random"], min_budget=0.0, quick=False)
    calls = recorded_searches(tmp_path, monkeypatch)
    other = quality_bench.Results(tmp_path)
    other.put("runs", "d/0/dnas", record(tmp_path, "dnas", 0, {"c": result(0.7, 0.7, 1.0)}, ("candidate", "c")))
    with other.claim("d/0/random") as held:  # the other process is training random on seed 0
        assert held
        quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).run_seed("d", 0)
    assert calls == []
    quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).run_seed("d", 0)  # claim released
    assert calls == [("random", 100.0)]


def test_a_ranking_another_process_claimed_is_left_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(set=[], ranking_archs=20, quick=False)
    calls = []
    monkeypatch.setattr(quality_bench.Bench, "_ranking", lambda self, data, seed, key: calls.append(key))
    other = quality_bench.Results(tmp_path)
    with other.claim("ranking/d/0") as held:
        assert held
        quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).ranking("d", 0)
    assert calls == []
    quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).ranking("d", 0)
    assert calls == ["d/0"]


def test_a_strategy_waits_for_the_clock_another_process_is_measuring(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``dnas`` search that sets seed 0's clock runs in another process: a process given only
    ``random`` waits for it to end and then runs under its clock, instead of skipping the seed."""
    import threading

    args = argparse.Namespace(set=[], strategies=["random"], min_budget=0.0, quick=False)
    calls, held, waiting = recorded_searches(tmp_path, monkeypatch), threading.Event(), threading.Event()
    wait = quality_bench.Results.wait

    def noted_wait(self: Any, key: str) -> dict[str, Any]:
        waiting.set()
        return wait(self, key)

    monkeypatch.setattr(quality_bench.Results, "wait", noted_wait)

    def other_process() -> None:
        other = quality_bench.Results(tmp_path)
        with other.claim("d/0/dnas"):
            held.set()
            assert waiting.wait(60)  # the bench below found no clock and waits for this search
            other.put("runs", "d/0/dnas", record(tmp_path, "dnas", 0, {"c": result(0.7, 0.7, 1.0)},
                                                 ("candidate", "c")))

    thread = threading.Thread(target=other_process)
    thread.start()
    assert held.wait(60)
    quality_bench.Bench(args, tmp_path, quality_bench.Results(tmp_path)).run_seed("d", 0)
    thread.join(60)
    assert calls == [("random", 100.0)]


def test_the_command_uses_the_cli_flags_and_each_key_once() -> None:
    opts = quality_bench.overrides(["search.strategy=tpe", "search.time_budget=90", "data.rows=10",
                                    "data.rows=20"])
    line = quality_bench.command(opts)
    assert line[1:4] == ["-m", "rankitect", "search"]
    assert line[4:] == ["--strategy", "tpe", "--time-budget", "90", "data.rows=20"]
