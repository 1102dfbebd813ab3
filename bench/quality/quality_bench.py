"""Search quality on real and synthetic data: every strategy against the six baselines, 3 seeds each.

    python -m bench.quality.quality_bench                 # hours on 2 cores
    python -m bench.quality.quality_bench --reduced       # minutes: 1 seed, short runs
    # the runs of docs/benchmarks.md, e.g.:
    python -m bench.quality.quality_bench --data adult --strategies dnas --budget 15 --jobs 3 \
        --set "search.baselines=[dlrm,dcnv2,deepfm,autoint,dhen]" --out adult15

For each data set (``../shared/data/adult.csv`` with its schema, real; the synthetic default) and
each strategy (``evolution``, ``tpe``, ``oneshot``, ``dnas``) and seed, one default ``rankitect
search`` runs in a process of its own (the six baselines are trained by every search: they are the
same models with the same seed, so their spread across seeds is training noise). Where the config
has ``search.time_budget`` (the training protocol's wall-clock budget) every search gets the same
one (``--budget`` minutes) and no cap on candidates, so the budget ends every search; otherwise the
sampling strategies get ``--trials`` candidates.

Prints one table per data set: mean and spread (standard deviation over seeds) of test NE, AUC,
MFLOPs and search minutes for each baseline and for the model each strategy returned (its winner,
which may be a baseline), the winner the same rule picks among the models at no more than the
search's own FLOPs target (``<strategy> (at target)``: what a search under a hard cost cap at its
``auto`` target, the best baseline's FLOPs, would return; chosen on validation, read off the same
Pareto table), then the goals of the issue: the best strategy's test NE against the best
baseline's by mean test NE (relative, at no more than its FLOPs), each strategy against each seed's
best baseline on validation (the one its ``auto`` target aimed at, as an engineer picks what to ship
without the test set) and DNAS against the best strategy. Writes a
Pareto plot of every point (``quality_<data>.png``) beside the working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from bench.common import ROOT, SHARED_DATA, parse_args

DATA = {
    "adult": [f"data.source={SHARED_DATA / 'adult.csv'}", f"data.schema={SHARED_DATA / 'adult.yaml'}"],
    "synthetic": ["data.source=synthetic"],
}
STRATEGIES = ("evolution", "tpe", "oneshot", "dnas")


def child(overrides: list[str], out: str) -> None:
    """One search with ``overrides``; its Pareto table and wall time written to ``out`` (JSON)."""
    import torch

    from rankitect.config import load_config
    from rankitect.search.runner import SearchRunner

    torch.set_num_threads(1)
    cfg = load_config(overrides=overrides)
    start = time.perf_counter()
    runner = SearchRunner(cfg, echo=lambda line: print("   ", line, flush=True))
    outcome = runner.run()
    target = runner.standings.objective.target_mflops
    trials = runner.recorder.all_trials()
    # the winner under a hard cap at the target
    within = runner.standings.winner_within(trials, target) if target else None
    Path(out).write_text(json.dumps({"table": outcome.table.to_dict(orient="records"),
                                     "minutes": (time.perf_counter() - start) / 60, "target_mflops": target,
                                     "within": None if within is None else [within.winner.kind, within.winner.name]}))


def has_time_budget() -> bool:
    from rankitect.config import SearchConfig

    return "time_budget" in SearchConfig.__dataclass_fields__


def data_overrides(data: str, args: argparse.Namespace) -> list[str]:
    rows = 20_000 if args.reduced else args.rows
    return [*DATA[data], *([f"data.rows={rows}"] if data == "synthetic" and rows else [])]


def prepare(overrides: list[str], cache: Path) -> None:
    """Read (or generate) a data set into the cache the searches share."""
    from rankitect.config import load_config
    from rankitect.data import open_data

    cfg = load_config(overrides=[*overrides, f"data.cache_dir={cache}"])
    open_data(cfg.data.source, cfg.data, progress=False)


def run_one(data: str, strategy: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any] | None:
    overrides = [*data_overrides(data, args), f"data.cache_dir={tmp / 'data'}", f"search.strategy={strategy}",
                 f"search.seed={seed}", f"train.seed={seed}", "train.progress=false", "runtime.threads=1",
                 f"search.trials={args.trials}"]
    overrides += args.set
    if has_time_budget():
        overrides.append(f"search.time_budget={args.budget * 60}")
    if args.reduced:
        overrides += ["train.steps=100", "train.val_every=50", "search.oneshot.supernet_steps=150",
                      "search.oneshot.warmup_steps=50", "search.oneshot.children=8", "search.oneshot.population=8",
                      "search.oneshot.top_k=1", "search.dnas.supernet_steps=100", "search.dnas.warmup_steps=20"]
    out = Path(args.out) / "runs" / f"{data}-{strategy}-{seed}.json"  # kept: --summarize rebuilds from them
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns-{data}-{strategy}-{seed}/mlflow.db",
           "PYTHONUNBUFFERED": "1"}
    code = f"from bench.quality.quality_bench import child; child({overrides!r}, {str(out)!r})"
    print(f"{data} / {strategy} / seed {seed}: started", flush=True)
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{data}-{strategy}-{seed}.log", "w") as log:
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    print(f"{data} / {strategy} / seed {seed}: {'done' if done.returncode == 0 else 'FAILED (see its log)'}", flush=True)
    return json.loads(out.read_text()) if done.returncode == 0 else None


def rows_of(data: str, strategy: str, seed: int, run: dict[str, Any]) -> list[dict[str, Any]]:
    table = pd.DataFrame(run["table"])
    rows = [{"data": data, "model": r["name"], "seed": seed, "test_ne": r["test_ne"], "test_auc": r["test_auc"],
             "mflops": r["mflops"], "minutes": None, "kind": "baseline"}
            for _, r in table[(table["kind"] == "baseline") & (table["status"] == "ok")].iterrows()]
    win = table[table["winner"]]
    if len(win):
        w = win.iloc[0]
        rows.append({"data": data, "model": strategy, "seed": seed, "test_ne": w["test_ne"], "test_auc": w["test_auc"],
                     "mflops": w["mflops"], "minutes": run["minutes"], "kind": f"found ({w['kind']})",
                     **aimed_at(table, run.get("target_mflops"))})
    if run.get("within"):  # the same rule among the models at no more than the search's target FLOPs
        kind, name = run["within"]
        w = table[(table["kind"] == kind) & (table["name"] == name)].iloc[0]
        rows.append({"data": data, "model": f"{strategy} (at target)", "seed": seed, "test_ne": w["test_ne"],
                     "test_auc": w["test_auc"], "mflops": w["mflops"], "minutes": run["minutes"],
                     "kind": f"at target ({kind})", "target_mflops": run["target_mflops"]})
    cands = table[(table["kind"] == "candidate") & (table["status"] == "ok")]
    if len(cands):  # the strategy's own best model, also where a baseline won the search
        c = cands.loc[cands["objective"].idxmin()]
        rows.append({"data": data, "model": f"{strategy} (cand)", "seed": seed, "test_ne": c["test_ne"],
                     "test_auc": c["test_auc"], "mflops": c["mflops"], "minutes": run["minutes"], "kind": "candidate",
                     "candidates": int((table["kind"] == "candidate").sum())})
    return rows


def aimed_at(table: pd.DataFrame, target: float | None) -> dict[str, Any]:
    """The baseline whose FLOPs the search's ``auto`` target took (the best on validation by the
    objective, or the cheapest within ``search.min_gain_se`` standard errors of it; of the baselines
    at those FLOPs, the best by validation NE): its name, test NE and FLOPs."""
    from rankitect.search.objective import at_most

    if target is None:
        return {}
    bases = table[(table["kind"] == "baseline") & (table["status"] == "ok")]
    bases = bases[[at_most(m, target) and at_most(target, m) for m in bases["mflops"]]]
    if not len(bases):
        return {}
    b = bases.loc[bases["val_ne"].idxmin()]
    return {"aimed_at": b["name"], "aimed_ne": b["test_ne"], "aimed_mflops": b["mflops"]}


def per_seed(d: pd.DataFrame) -> None:
    """Each strategy against each seed's own best baseline, the one its search found on validation
    (NE, and FLOPs as the objective weighs them) and aimed at (``target_mflops: auto``), as an
    engineer picks what to ship without the test set."""
    from rankitect.search.objective import at_most

    if "aimed_at" not in d:
        return
    for strategy, g in d[d["model"].isin(STRATEGIES) & d["aimed_at"].notna()].groupby("model"):
        gains = 1 - g["test_ne"] / g["aimed_ne"]
        within = [at_most(m, a) for m, a in zip(g["mflops"], g["aimed_mflops"])]
        seeds = ", ".join(f"{s}: {n} {x:+.2%}" for s, n, x in zip(g["seed"], g["aimed_at"], gains))
        print(f"  {strategy} against the baseline each seed's search aimed at ({seeds}): test NE {gains.mean():+.2%} "
              f"on the mean, at no more than its FLOPs in {sum(within)} of {len(g)} seeds")


def summarize(df: pd.DataFrame, data: str) -> None:
    d = df[df["data"] == data].assign(candidate=lambda x: x["kind"].isin(["found (candidate)", "at target (candidate)"]))
    d = d.drop_duplicates(["model", "seed"])  # every search of a seed trains the same baselines
    agg = d.groupby("model").agg(test_ne=("test_ne", "mean"), ne_sd=("test_ne", "std"),
                                 auc=("test_auc", "mean"), auc_sd=("test_auc", "std"), mflops=("mflops", "mean"),
                                 minutes=("minutes", "mean"), seeds=("seed", "nunique"),
                                 cand_won=("candidate", "sum"),
                                 **({"trained": ("candidates", "mean")} if "candidates" in d else {})).sort_values("test_ne")
    print(f"\n{data}:\n{agg.to_string(float_format=lambda v: f'{v:.4f}')}")
    bases = agg.loc[[m for m in agg.index if m not in STRATEGIES and not m.endswith(("(cand)", "(at target)"))]]
    found = agg.loc[[m for m in agg.index if m in STRATEGIES or m.endswith("(at target)")]]
    if not len(bases) or not len(found):
        return
    best_base = bases["test_ne"].idxmin()
    cheap = found[found["mflops"] <= bases.loc[best_base, "mflops"]]
    if len(cheap):
        best = cheap["test_ne"].idxmin()
        gain = 1 - cheap.loc[best, "test_ne"] / bases.loc[best_base, "test_ne"]
        print(f"  best strategy at no more than {best_base}'s FLOPs: {best}, test NE {gain:+.2%} vs {best_base} "
              f"(goal >= +0.30%)")
    else:
        print(f"  no strategy returned a model at no more than {best_base}'s {bases.loc[best_base, 'mflops']:.3f} "
              f"MFLOPs (goal: >= +0.30% test NE at no more FLOPs)")
    per_seed(d)
    if "dnas" in found.index:
        gap = found.loc["dnas", "test_ne"] / found.loc[[m for m in found.index if m in STRATEGIES], "test_ne"].min() - 1
        print(f"  dnas vs the best strategy: {gap:+.2%} test NE (goal <= +0.10%)")


def plot(df: pd.DataFrame, data: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = df[df["data"] == data]
    fig, ax = plt.subplots(figsize=(8, 5))
    for model, g in d.groupby("model"):
        marker = ("o" if model in STRATEGIES else "^" if model.endswith("(cand)")
                  else "D" if model.endswith("(at target)") else "s")
        ax.scatter(g["mflops"], g["test_ne"], label=model, marker=marker)
    ax.set_xscale("log")
    ax.set(xlabel="MFLOPs per example", ylabel="test NE", title=f"search quality on {data}")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="adult,synthetic")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--trials", type=int, default=None,
                        help="search.trials: candidates of the sampling strategies (default 16; with search.time_budget "
                             "10,000, so that the budget, not the count, ends every search)")
    parser.add_argument("--budget", type=float, default=30.0, help="minutes per search (with search.time_budget)")
    parser.add_argument("--rows", type=int, default=0, help="synthetic rows (data.rows); 0: the default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every search (e.g. train.max_epochs=5); repeatable")
    parser.add_argument("--jobs", type=int, default=1, help="searches at a time, one thread each")
    parser.add_argument("--out", default=".", help="folder of the results (quality.jsonl) and the plots")
    parser.add_argument("--summarize", action="store_true", help="print the tables of --out's results, run nothing")
    parser.add_argument("--reduced", action="store_true", help="1 seed, 20k synthetic rows, short trainings")
    args = parse_args(parser, {"data": "synthetic", "strategies": "evolution", "seeds": 1, "trials": 1, "rows": 3000,
                               "set": ["search.baselines=[dlrm]", "train.steps=5", "train.val_every=5"]}, argv)
    if args.trials is None:
        args.trials = 10_000 if has_time_budget() else 16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "quality.jsonl"
    if not args.summarize:
        seeds = 1 if args.reduced else args.seeds
        runs = [(d, s, seed) for seed in range(args.first_seed, args.first_seed + seeds) for d in args.data.split(",") for s in args.strategies.split(",")]
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
            for data in args.data.split(","):  # cached once, before searches in parallel would race to write it
                prepare(data_overrides(data, args), Path(tmp) / "data")
            futures = {pool.submit(run_one, *run, args, Path(tmp)): run for run in runs}
            for future in as_completed(futures):
                if future.result() is None:
                    continue
                rows = rows_of(*futures[future], future.result())
                with results.open("a") as f:  # kept as they finish: a cut-short run still has a table
                    f.writelines(json.dumps(r) + "\n" for r in rows)
    if args.summarize and (out / "runs").is_dir():  # the searches' own tables, read again
        rows = []
        for path in sorted((out / "runs").glob("*.json")):
            data, strategy, seed = path.stem.rsplit("-", 2)
            rows += rows_of(data, strategy, int(seed), json.loads(path.read_text()))
    else:
        rows = [json.loads(line) for line in results.read_text().splitlines()]
    df = pd.DataFrame(rows)
    for data in df["data"].unique():
        summarize(df, data)
        plot(df, data, out / f"quality_{data}.png")


if __name__ == "__main__":
    main()
