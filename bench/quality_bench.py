"""Search quality on real and synthetic data: every strategy against the six baselines, 3 seeds each.

    PYTHONPATH=$PWD .venv/bin/python bench/quality_bench.py                 # hours on 2 cores
    PYTHONPATH=$PWD .venv/bin/python bench/quality_bench.py --reduced       # minutes: 1 seed, short runs

For each data set (``../shared/data/adult.csv`` with its schema, real; the synthetic default) and
each strategy (``evolution``, ``tpe``, ``oneshot``, ``dnas``) and seed, one default ``rankitect
search`` runs in a process of its own (the six baselines are trained by every search: they are the
same models with the same seed, so their spread across seeds is training noise). Where the config
has ``search.time_budget`` (the training protocol's wall-clock budget) every search gets the same
one (``--budget`` minutes); otherwise the sampling strategies get ``--trials`` candidates.

Prints one table per data set: mean and spread (standard deviation over seeds) of test NE, AUC,
MFLOPs and search minutes for each baseline and for the model each strategy returned (its winner,
which may be a baseline), then the goals of the issue: the best strategy's test NE against the best
baseline's (relative, at no more than its FLOPs) and DNAS against the best strategy. Writes a
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
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = {
    "adult": [f"data.source={ROOT.parent / 'shared/data/adult.csv'}",
              f"data.schema={ROOT.parent / 'shared/data/adult.yaml'}"],
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
    outcome = SearchRunner(cfg, echo=lambda line: print("   ", line, flush=True)).run()
    Path(out).write_text(json.dumps({"table": outcome.table.to_dict(orient="records"),
                                     "minutes": (time.perf_counter() - start) / 60}))


def has_time_budget() -> bool:
    from rankitect.config import SearchConfig

    return "time_budget" in SearchConfig.__dataclass_fields__


def run_one(data: str, strategy: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    overrides = [*DATA[data], f"search.strategy={strategy}", f"search.seed={seed}", f"train.seed={seed}",
                 "train.progress=false", "runtime.threads=1", f"search.trials={args.trials}"]
    if has_time_budget():
        overrides.append(f"search.time_budget={args.budget * 60}")
    if args.reduced:
        overrides += ["data.rows=20000", "train.steps=100", "train.val_every=50", "search.oneshot.supernet_steps=150",
                      "search.oneshot.warmup_steps=50", "search.oneshot.children=8", "search.oneshot.population=8",
                      "search.oneshot.top_k=1", "search.dnas.supernet_steps=100", "search.dnas.warmup_steps=20"]
    out = tmp / f"{data}-{strategy}-{seed}.json"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db", "PYTHONUNBUFFERED": "1"}
    code = f"from bench.quality_bench import child; child({overrides!r}, {str(out)!r})"
    print(f"{data} / {strategy} / seed {seed}", flush=True)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def rows_of(data: str, strategy: str, seed: int, run: dict[str, Any]) -> list[dict[str, Any]]:
    table = pd.DataFrame(run["table"])
    rows = [{"data": data, "model": r["name"], "seed": seed, "test_ne": r["test_ne"], "test_auc": r["test_auc"],
             "mflops": r["mflops"], "minutes": None, "kind": "baseline"}
            for _, r in table[(table["kind"] == "baseline") & (table["status"] == "ok")].iterrows()]
    win = table[table["winner"]]
    if len(win):
        w = win.iloc[0]
        rows.append({"data": data, "model": strategy, "seed": seed, "test_ne": w["test_ne"], "test_auc": w["test_auc"],
                     "mflops": w["mflops"], "minutes": run["minutes"], "kind": f"found ({w['kind']})"})
    return rows


def summarize(df: pd.DataFrame, data: str) -> None:
    d = df[df["data"] == data]
    agg = d.groupby("model").agg(test_ne=("test_ne", "mean"), ne_sd=("test_ne", "std"),
                                 auc=("test_auc", "mean"), auc_sd=("test_auc", "std"), mflops=("mflops", "mean"),
                                 minutes=("minutes", "mean"), seeds=("seed", "nunique")).sort_values("test_ne")
    print(f"\n{data}:\n{agg.to_string(float_format=lambda v: f'{v:.4f}')}")
    bases = agg.loc[[m for m in agg.index if m not in STRATEGIES]]
    found = agg.loc[[m for m in agg.index if m in STRATEGIES]]
    if not len(bases) or not len(found):
        return
    best_base = bases["test_ne"].idxmin()
    cheap = found[found["mflops"] <= bases.loc[best_base, "mflops"]]
    if len(cheap):
        best = cheap["test_ne"].idxmin()
        gain = 1 - cheap.loc[best, "test_ne"] / bases.loc[best_base, "test_ne"]
        print(f"  best strategy at no more than {best_base}'s FLOPs: {best}, test NE {gain:+.2%} vs {best_base} "
              f"(goal >= +0.30%)")
    if "dnas" in found.index:
        gap = found.loc["dnas", "test_ne"] / found["test_ne"].min() - 1
        print(f"  dnas vs the best strategy: {gap:+.2%} test NE (goal <= +0.10%)")


def plot(df: pd.DataFrame, data: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = df[df["data"] == data]
    fig, ax = plt.subplots(figsize=(8, 5))
    for model, g in d.groupby("model"):
        marker = "o" if model in STRATEGIES else "s"
        ax.scatter(g["mflops"], g["test_ne"], label=model, marker=marker)
    ax.set_xscale("log")
    ax.set(xlabel="MFLOPs per example", ylabel="test NE", title=f"search quality on {data}")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="adult,synthetic")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=16, help="candidates of the sampling strategies")
    parser.add_argument("--budget", type=float, default=30.0, help="minutes per search (with search.time_budget)")
    parser.add_argument("--reduced", action="store_true", help="1 seed, 20k synthetic rows, short trainings")
    args = parser.parse_args()
    seeds = 1 if args.reduced else args.seeds
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for data in args.data.split(","):
            for strategy in args.strategies.split(","):
                for seed in range(seeds):
                    rows += rows_of(data, strategy, seed, run_one(data, strategy, seed, args, Path(tmp)))
    df = pd.DataFrame(rows)
    for data in args.data.split(","):
        summarize(df, data)
        plot(df, data, Path(f"quality_{data}.png"))


if __name__ == "__main__":
    main()
