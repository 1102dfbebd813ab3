"""Search quality at equal wall clock: every strategy against the best baseline, three data sets, 3 seeds.

    python -m bench.quality.quality_bench --out quality            # hours on 2 cores; resumable
    python -m bench.quality.quality_bench --out quality --data adult --seeds 0 --ranking-archs 0
    python -m bench.quality.quality_bench --out quality --summarize     # the tables and plots again
    python -m bench.quality.quality_bench --quick --out /tmp/quality    # a smoke run (a few minutes)

For each data set (``adult``: ``../shared/data/adult.csv`` with its schema; ``synthetic``: the
default source; ``synthetic-categorical``: the all-categorical log; ``history``: that log with
histories, ``data.history=20``, see :mod:`bench.quality.history_report`; or any ``data.source``) and
seed, the default ``rankitect search --strategy dnas`` runs first, with no option but the data and
the seed (``--seed S train.seed=S``: the baselines' training noise varies with it too); the seconds
its search took by its own clock (``state.json``'s ``elapsed``, the clock ``search.time_budget``
counts; the process's wall seconds, imports and the winner's logging included, are reported beside
it) become ``--time-budget`` of every other strategy (``--strategies``), with ``--trials`` large
(``--budget-trials``) so that the clock, not a count, ends them. Each search is a process of the
real CLI (``python -m rankitect search``) with a scratch MLflow store and search folder of its own
under ``--out/runs/``, read back from what it writes (``pareto.csv``, ``state.json``), so the bench
measures what a user gets. ``--set KEY=VALUE`` adds an override to every search (and to the
supernet ranking), e.g. ``runtime.threads=1`` or ``search.time_budget=5m`` to cap ``dnas`` too.

Then, per data set and seed, the supernet ranking of :mod:`bench.quality.supernet_ranking`
(Kendall tau between supernet-scored and stand-alone validation NE over ``--ranking-archs``
architectures around the best baseline; 0 skips it).

Prints per data set and seed the best baseline and each strategy's returned model against it
(see :mod:`bench.quality.quality_report`), then mean and spread over the seeds, ``dnas`` against
the best other strategy, and the ranking table; writes ``results.json`` (every search's Pareto
table, the rows and summaries) and ``quality_<data>.png`` (test NE against MFLOPs) under ``--out``.
Resumable: a (data, seed, strategy) or ranking already in ``results.json`` is not run again, and
bench processes may share one ``--out``: each claims a search before it runs it (a lock under
``--out/claims/`` held while it runs, released by the system when its process dies), so two
processes given the same seeds never run one search twice; a process whose strategy needs a
``dnas`` clock another process is still measuring waits for that search to end.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import ROOT, parse_args
from bench.quality import quality_report as report
from bench.quality import supernet_ranking

DATA = ("adult", "synthetic", "synthetic-categorical")
STRATEGIES = ("dnas", "random", "evolution", "tpe", "oneshot")
CLI_FLAGS = {"search.strategy": "--strategy", "search.seed": "--seed", "search.time_budget": "--time-budget",
             "search.trials": "--trials"}  # the rest go as key=value overrides
QUICK_SET = ["data.rows=3000", "search.baselines=[dlrm]", "search.trials=1", "train.steps=5", "train.val_every=5",
             "search.dnas.supernet.steps=10", "search.dnas.weights_only_steps=2", "search.oneshot.supernet.steps=10",
             "search.oneshot.widest_decay_steps=2", "search.oneshot.children=2", "search.oneshot.population=2",
             "search.oneshot.sample_size=2"]


def run_folder(out: Path, data_label: str, seed: int, strategy: str) -> Path:
    """The folder of one search under ``--out``: its store, log, command and search folder."""
    return out / "runs" / f"{data_label}-s{seed}-{strategy}"


def label(data: str) -> str:
    """A data set's name in keys and folder names (a file source: its file name without suffix)."""
    return Path(data).stem


def overrides(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict (a later one wins), so no key reaches the CLI twice."""
    return dict(item.split("=", 1) for item in items)


def command(opts: dict[str, str], *tail: str) -> list[str]:
    """The ``rankitect search`` command line of ``opts``: flags where the CLI has one, else overrides."""
    line = [sys.executable, "-m", "rankitect", "search"]
    for key, value in opts.items():
        line += [CLI_FLAGS[key], value] if key in CLI_FLAGS else [f"{key}={value}"]
    return [*line, *tail]


class Results:
    """``results.json`` under ``--out``: what has finished, re-read and merged under a lock on every
    write, so bench processes sharing the folder keep each other's results."""

    def __init__(self, out: Path) -> None:
        self.path, self.lock_path = out / "results.json", out / "results.json.lock"
        self.data = self._read()

    def _read(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"runs": {}, "ranking": {}, "failed": {}}
        return {**empty, **json.loads(self.path.read_text())} if self.path.exists() else empty

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def put(self, part: str, key: str, value: dict[str, Any] | None) -> None:
        """Record ``value`` under ``part``/``key`` (``None``: remove it) and rewrite the file."""
        with self._locked():
            self.data = self._read()
            if value is None:
                self.data[part].pop(key, None)
            else:
                self.data[part][key] = value
            self.write()

    def reload(self) -> dict[str, Any]:
        """Re-read the file (other processes' results included); returns its ``runs``."""
        with self._locked():
            self.data = self._read()
        return self.data["runs"]

    def _claim_path(self, key: str) -> Path:
        folder = self.path.parent / "claims"
        folder.mkdir(exist_ok=True)
        return folder / (key.replace("/", "-") + ".lock")

    @contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """Hold ``key`` while the ``with`` runs: yields False (and holds nothing) when another
        process holds it. The lock dies with its process, so a killed bench leaves no claim."""
        with open(self._claim_path(key), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True

    def wait(self, key: str) -> dict[str, Any]:
        """Wait until no process holds ``key``; returns the ``runs`` read then."""
        with open(self._claim_path(key), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        return self.reload()

    def refresh(self) -> None:
        """Re-read the file (other processes' results included) and rewrite its rows and summaries.
        A search recorded before the bench read its pick at the target
        (:func:`~bench.quality.quality_report.at_target`) has it read from its folder, where that is kept."""
        with self._locked():
            self.data = self._read()
            for run in self.data["runs"].values():
                folder = run_folder(self.path.parent, run["data"], run["seed"], run["strategy"]) / "searches"
                if "at_target" not in run and folder.is_dir():
                    run["at_target"] = report.read_search(folder)["at_target"]
            self.write()

    def write(self) -> None:
        rows = report.seed_rows(self.data["runs"])
        self.data["rows"] = rows
        self.data["summary"] = {d: report.aggregate(rows, d) for d in sorted({r["data"] for r in rows})}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_json_default, allow_nan=False))
        tmp.replace(self.path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _clean(record: dict[str, Any]) -> dict[str, Any]:
    """NaN as ``None`` (results.json stays plain JSON)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}


class Bench:
    """The searches and rankings of one bench process, in order, skipping what ``results`` holds."""

    def __init__(self, args: argparse.Namespace, out: Path, results: Results) -> None:
        self.args, self.out, self.results = args, out, results
        self.extra = overrides(args.set)

    def data_opts(self, data: str) -> dict[str, str]:
        """The data set's ``data.*`` overrides, the shared cache, and ``--set``'s ``data.*`` keys."""
        opts = overrides(supernet_ranking.data_overrides(data))
        opts["data.cache_dir"] = str(self.out / "data")
        return {**opts, **{k: v for k, v in self.extra.items() if k.startswith("data.")}}

    def prepare(self, data: str) -> None:
        """Read (or generate) the data set into the shared cache before any search is timed."""
        line = [sys.executable, "-m", "rankitect", "data", "inspect",
                *(f"{k}={v}" for k, v in self.data_opts(data).items())]
        done = subprocess.run(line, cwd=self.out, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if done.returncode != 0:
            raise SystemExit(f"{data}: the data set could not be read:\n{done.stdout[-2000:]}")

    def search(self, data: str, seed: int, strategy: str, budget_s: float | None) -> dict[str, Any] | None:
        """One search through the CLI; its record, or ``None`` when it failed (its log says why)."""
        folder = run_folder(self.out, label(data), seed, strategy)
        name = folder.name
        shutil.rmtree(folder, ignore_errors=True)  # a cut-short attempt's store and folder
        folder.mkdir(parents=True)
        opts = {**self.data_opts(data), "track.uri": f"sqlite:///{folder / 'mlflow.db'}",
                "search.output_dir": str(folder / "searches"), "search.strategy": strategy,
                "search.seed": str(seed), "train.seed": str(seed)}
        if budget_s is not None:
            opts.update({"search.time_budget": f"{max(1, round(budget_s))}",
                         "search.trials": str(self.args.budget_trials)})
        opts.update(self.extra)
        line = command(opts)
        (folder / "command.txt").write_text(" ".join(line[1:]) + "\n")
        print(f"{name}: {' '.join(line[2:])}", flush=True)
        began = time.perf_counter()
        with open(folder / "search.log", "w") as log:
            done = subprocess.run(line, cwd=folder, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            print(f"{name}: FAILED, exit status {done.returncode} (see {folder / 'search.log'})", flush=True)
            return None
        read = report.read_search(folder / "searches")
        print(f"{name}: done in {wall:.0f} s (search {read['search_s']:.0f} s)", flush=True)
        return {"data": label(data), "seed": seed, "strategy": strategy, "wall_s": wall, "clock_s": budget_s,
                "time_budget": opts.get("search.time_budget"), "command": line[1:], **read}

    def run_seed(self, data: str, seed: int) -> None:
        """``dnas`` first (its search seconds are the clock), then every other strategy under it;
        a search another bench process has claimed is left to it (:meth:`Results.claim`)."""
        clock_key = f"{label(data)}/{seed}/{report.CLOCK}"
        for strategy in self.args.strategies:
            key = f"{label(data)}/{seed}/{strategy}"
            with self.results.claim(key) as mine:
                if not mine:
                    print(f"{key}: skipped, another bench process is running it", flush=True)
                    continue
                runs = self.results.reload()
                if key in runs:
                    continue
                budget = None
                if strategy != report.CLOCK:
                    if clock_key not in runs:
                        runs = self.results.wait(clock_key)  # another process may be measuring it
                    if clock_key not in runs:
                        print(f"{key}: skipped, no {report.CLOCK} search to set its clock", flush=True)
                        continue
                    budget = max(runs[clock_key]["search_s"] or runs[clock_key]["wall_s"], self.args.min_budget)
                record = self.search(data, seed, strategy, budget)
                if record is None:
                    self.results.put("failed", key, {"at": time.strftime("%Y-%m-%d %H:%M:%S")})
                else:
                    self.results.put("runs", key, record)
                    self.results.put("failed", key, None)

    def ranking(self, data: str, seed: int) -> None:
        """The supernet ranking of ``data`` and ``seed`` (:func:`bench.quality.supernet_ranking.one_run`),
        unless ``results.json`` holds it or another bench process is running it."""
        key = f"{label(data)}/{seed}"
        if self.args.ranking_archs <= 0:
            return
        with self.results.claim(f"ranking/{key}") as mine:
            if not mine:
                print(f"{key}: supernet ranking skipped, another bench process is running it", flush=True)
                return
            self.results.reload()
            if key not in self.results.data["ranking"]:
                self._ranking(data, seed, key)

    def _ranking(self, data: str, seed: int, key: str) -> None:
        import torch

        from rankitect.config import load_config

        quick = overrides(supernet_ranking.QUICK) if self.args.quick else {}  # its own smoke-run training
        opts = {**self.extra, **quick, **self.data_opts(data), "train.progress": "false"}  # the searches' data
        dnas = [f"search.dnas.{item}" for item in (supernet_ranking.QUICK_DNAS if self.args.quick else [])]
        cfg = load_config(overrides=[*(f"{k}={v}" for k, v in opts.items()), *dnas])
        how = argparse.Namespace(start=self.args.ranking_start, archs=self.args.ranking_archs, supernet="dnas",
                                 verbose=False)
        print(f"{key}: supernet ranking over {how.archs} architectures", flush=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(int(self.extra.get("runtime.threads", 0)) or threads)
        try:
            result = supernet_ranking.one_run(cfg, how, seed)
        finally:
            torch.set_num_threads(threads)
        self.results.put("ranking", key, _clean({"data": label(data), "seed": seed, **result}))


def _env() -> dict[str, str]:
    """The environment of a CLI process: this checkout's ``rankitect`` first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def show(results: Results, out: Path) -> None:
    """Print every table and draw every plot from ``results``."""
    rows, summary = results.data.get("rows", []), results.data.get("summary", {})
    for data in summary:
        report.print_seeds(rows, data)
        report.print_summary(summary[data], data)
        report.plot(results.data["runs"], data, out / f"quality_{data}.png")
    report.print_ranking(results.data["ranking"])
    if results.data["failed"]:
        print(f"\nfailed (run again to retry): {', '.join(sorted(results.data['failed']))}")
    print(f"\nresults: {results.path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    listed: Callable[[str], list[str]] = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    parser.add_argument("--data", type=listed, default=list(DATA),
                        help="data sets: adult, synthetic, synthetic-categorical, history or any data.source "
                             "(comma-separated)")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in listed(s)], default=[0, 1, 2])
    parser.add_argument("--strategies", type=listed, default=list(STRATEGIES),
                        help="dnas runs first whatever the order: its search time is the others' --time-budget")
    parser.add_argument("--budget-trials", type=int, default=10_000,
                        help="--trials of the strategies under the dnas clock (large: the clock ends them)")
    parser.add_argument("--min-budget", type=float, default=0.0,
                        help="seconds: the least --time-budget a strategy under the clock gets (--quick: a tiny "
                             "dnas search ends before one baseline could train under its clock)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every search and the ranking; repeatable")
    parser.add_argument("--ranking-archs", type=int, default=20,
                        help="architectures of the supernet ranking per data set and seed (0: no ranking)")
    parser.add_argument("--ranking-start", default="auto", help="auto (the best baseline) or a baseline name")
    parser.add_argument("--out", default="quality", help="folder of results.json, the plots and every search")
    parser.add_argument("--summarize", action="store_true", help="print the tables of --out's results, run nothing")
    args = parse_args(parser, {"data": ["synthetic"], "seeds": [0], "strategies": ["dnas", "random"],
                               "budget_trials": 1, "min_budget": 15, "set": QUICK_SET, "ranking_archs": 3, "ranking_start": "dlrm"},
                      argv)
    args.strategies = [report.CLOCK] + [s for s in args.strategies if s != report.CLOCK]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out)
    if not args.summarize:
        bench = Bench(args, out, results)
        for data in args.data:
            todo = [(s, t) for s in args.seeds for t in args.strategies
                    if f"{label(data)}/{s}/{t}" not in results.data["runs"]]
            if todo:
                bench.prepare(data)
            for seed in args.seeds:
                bench.run_seed(data, seed)
                bench.ranking(data, seed)
    results.refresh()
    show(results, out)


if __name__ == "__main__":
    main()
