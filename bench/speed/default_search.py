"""The default search's wall time, serial against the default (workers on every core), side by side.

    python -m bench.speed.default_search --out speed --data synthetic-categorical,adult --seeds 0,1,2
    python -m bench.speed.default_search --out early --data synthetic-categorical,adult --modes no-early,default
    python -m bench.speed.default_search --out speed --summarize     # the tables again
    python -m bench.speed.default_search --quick --out /tmp/speed

For each data set and seed, ``rankitect search --strategy dnas`` runs twice, one after the other on
the same machine: ``serial`` (``search.workers=1``: every trial in the search's own process, on
every core, as searches ran before) and ``default`` (nothing but the data and the seed:
``search.workers auto``, one worker per core). ``--modes no-early,default`` sets the default
against ``no-early`` (``search.pruning_early_rung=false``: candidates first judged at the first
rung, as before the early rung). Each search is a process of the real CLI with a
store and search folder of its own under ``--out/runs/`` (no baseline is reused across them), so
the wall time is what a user waits, imports and the winner's logging included. The two modes of a
seed alternate which runs first, so a machine's slow spell does not fall on one mode.

Prints per data set and seed each mode's wall seconds, the returned model's test NE against the
best baseline (in %; negative: better), the ratio of the wall times and the worker-minutes of
pruned trials; then per data set the means and spreads over the seeds. ``results.json`` under ``--out`` keeps every search (the bench resumes
where it stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, parse_args
from bench.quality import quality_report as report
from bench.quality.supernet_ranking import data_overrides

MODES = {"serial": ["search.workers=1"], "no-early": ["search.pruning_early_rung=false"], "default": []}


def one(out: Path, data: str, seed: int, mode: str, extra: list[str]) -> dict[str, Any]:
    """One search of ``mode`` through the CLI; its wall seconds and what it returned."""
    folder = out / "runs" / f"{Path(data).stem}-s{seed}-{mode}"
    folder.mkdir(parents=True, exist_ok=True)
    line = [sys.executable, "-m", "rankitect", "search", "--strategy", "dnas", "--seed", str(seed), f"train.seed={seed}",
            *data_overrides(data), f"data.cache_dir={out / 'data'}", f"track.uri=sqlite:///{folder / 'mlflow.db'}",
            f"search.output_dir={folder / 'searches'}", *MODES[mode], *extra]
    began = time.perf_counter()
    with open(folder / "search.log", "w") as log:
        done = subprocess.run(line, cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{folder.name}: exit status {done.returncode}, see {folder / 'search.log'}")
    read = report.read_search(folder / "searches")
    base, won = report.best_baseline(read["table"]), report.returned(read["table"])
    state = json.loads(next((folder / "searches").glob("*/state.json")).read_text())
    pruned = [t["result"] for t in state["trials"] if t["result"]["status"] == "pruned"]
    return {"data": Path(data).stem, "seed": seed, "mode": mode, "wall_s": wall, "returned": won["name"],
            "pruned_min": sum(r.get("train_seconds") or 0.0 for r in pruned) / 60, "pruned": len(pruned),
            "is_baseline": won["kind"] == "baseline", "baseline": base["name"],
            "diff_pct": report.against(won, base)["diff_pct"], "test_z": read.get("test_z")}


def show(results: dict[str, Any], modes: tuple[str, str] = ("serial", "default")) -> None:
    a, b = modes
    rows = [r for r in results.values() if r["mode"] in modes]
    print(f"\n{'data':<24}{'seed':>5}{a + ' s':>12}{b + ' s':>12}{'ratio':>7}{a + ' vs best':>17}"
          f"{b + ' vs best':>17}{'pruned min':>14}")
    keys = sorted({(r["data"], r["seed"]) for r in rows})
    for data, seed in keys:
        got = {r["mode"]: r for r in rows if (r["data"], r["seed"]) == (data, seed)}
        if len(got) < 2:
            continue
        s, d = got[a], got[b]
        pruned = "/".join("?" if r.get("pruned_min") is None else f"{r['pruned_min']:.1f}" for r in (s, d))
        print(f"{data:<24}{seed:>5}{s['wall_s']:>12.0f}{d['wall_s']:>12.0f}{d['wall_s'] / s['wall_s']:>7.2f}"
              f"{s['diff_pct']:>+16.2f}%{d['diff_pct']:>+16.2f}%{pruned:>14}")
    for data in sorted({d for d, _ in keys}):
        print(f"\n{data}:")
        for mode in modes:
            mine = [r for r in rows if r["data"] == data and r["mode"] == mode]
            walls, diffs = [r["wall_s"] / 60 for r in mine], [r["diff_pct"] for r in mine]
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
            print(f"  {mode:<8} wall {statistics.mean(walls):.1f} +- {sd(walls):.1f} min "
                  f"({', '.join(f'{w:.1f}' for w in walls)}); test NE vs the best baseline "
                  f"{statistics.mean(diffs):+.2f}% +- {sd(diffs):.2f} ({', '.join(f'{v:+.2f}' for v in diffs)})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("speed"))
    parser.add_argument("--data", default="synthetic-categorical,adult")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every search")
    parser.add_argument("--modes", default="serial,default", help=f"the two modes set side by side, of {', '.join(MODES)}")
    parser.add_argument("--summarize", action="store_true", help="print the tables of --out and stop")
    args = parse_args(parser, {"data": "synthetic", "seeds": "0", "set": [
        "data.rows=3000", "search.baselines=[dlrm]", "search.trials=1", "train.steps=5", "train.val_every=5",
        "search.dnas.supernet.steps=10", "search.dnas.weights_only_steps=2"]}, argv)
    modes = tuple(args.modes.split(","))
    if len(modes) != 2 or not set(modes) <= set(MODES):
        raise SystemExit(f"--modes: two of {', '.join(MODES)}, got {args.modes!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.summarize:
        for data in args.data.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                order = list(modes) if seed % 2 == 0 else list(reversed(modes))  # which runs first alternates
                for mode in order:
                    key = f"{Path(data).stem}/{seed}/{mode}"
                    if key not in results:
                        results[key] = one(args.out, data, seed, mode, args.set)
                        path.write_text(json.dumps(results, indent=1))
                        r = results[key]
                        print(f"{key}: {r['wall_s']:.0f} s, returned {r['returned']} ({r['diff_pct']:+.2f}%)", flush=True)
    show(results, modes)


if __name__ == "__main__":
    main()
