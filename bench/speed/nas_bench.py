"""Weight-sharing search on the default synthetic data: DNAS and one-shot costs, and what they find.

    python -m bench.speed.nas_bench            # the default nasrec space, 300 steps per candidate
    python -m bench.speed.nas_bench --steps 100   # 100 steps per candidate: minutes, not an hour
    python -m bench.speed.nas_bench --cost     # default dnas and oneshot searches, 100k rows x 10 fields

``--cost`` (:mod:`bench.speed.nas_cost`) runs each default search in a process of its own and prints the
weight-sharing part (supernet plus retraining) over one training of the architecture found (goals:
dnas <= 3, oneshot <= 5) and the process's peak RSS (goal: dnas under 2 GB).

Prints, in one run (times side by side on the same machine, so their ratios hold on a noisy one):

1. DNAS search wall time (supernet and architecture weights, ``--steps`` weight steps) divided by
   the training time of one candidate at the same steps: the derived architecture trained from
   scratch (goal <= 3);
2. one-shot: the time to score a child with inherited weights (head fine-tune + validation batches)
   against training that same child from scratch and scoring it (goal >= 50x cheaper);
3. a quality table on the test split: the architectures found by ``dnas``, ``oneshot`` and
   ``evolution`` under one wall-clock budget (the DNAS run's, retraining included), every
   hand-designed baseline trained for the same steps, and the Bayes-optimal NE of the split.

``--quick`` (4 slots, a few steps, a few thousand rows) only checks that every part runs. Measured
numbers, with their commands: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from bench.common import parse_args
from bench.speed.nas_cost import cost_bench
from rankitect.config import DnasConfig, OneShotConfig, SupernetConfig, load_config
from rankitect.data import open_data
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from rankitect.search.strategies.oneshot import best_scored
from rankitect.supernet.dnas_phase import dnas_search
from rankitect.supernet.oneshot_phase import make_scorer, train_supernet
from rankitect.supernet.train import build_supernet
from rankitect.search.running.trial import run_trial
from rankitect.space import get_space
from rankitect.space.baselines import BASELINES, get_baseline

QUICK_SPACE = {"num_blocks": 4, "widths": (16, 32, 64, 128, 256), "tokens": (16, 32)}


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - start


def run_dnas(space: Any, data: Any, train_cfg: Any, objective: Objective, args: argparse.Namespace) -> dict:
    """DNAS search, then the derived architecture trained from scratch."""
    cfg = DnasConfig(supernet=SupernetConfig(steps=args.steps, epochs="auto"), weights_only_steps=args.steps // 6)
    start = time.perf_counter()
    supernet = build_supernet(space, data.spec, args.seed)
    weights, search_s = timed(dnas_search, supernet, data, train_cfg, cfg, objective, seed=args.seed,
                              progress=True)
    arch = space.decode(weights.argmax())
    out, retrain_s = timed(run_trial, arch, data, train_cfg)
    params = sum(p.numel() for p in supernet.parameters())
    return {"arch": arch, "result": out.result, "search_s": search_s, "cand_s": out.result.train_seconds,
            "wall_s": time.perf_counter() - start, "supernet_params": params,
            "arch_steps": cfg.supernet.steps - cfg.weights_only_steps}


def run_oneshot(space: Any, data: Any, train_cfg: Any, objective: Objective, args: argparse.Namespace,
                budget: float, retrain_guess: float) -> dict:
    """Supernet, children scored until the budget leaves room for one retraining, best retrained."""
    cfg = OneShotConfig(supernet=SupernetConfig(steps=args.steps), widest_decay_steps=args.steps // 3,
                        population=args.population,
                        sample_size=max(2, args.population // 4))
    start = time.perf_counter()
    supernet = build_supernet(space, data.spec, args.seed)
    train_supernet(supernet, data, train_cfg, cfg, seed=args.seed, progress=True)
    scorer = make_scorer(supernet, data, train_cfg, cfg)
    strategy = build_strategy("evolution", space, seed=args.seed, objective=objective, population=cfg.population,
                              sample_size=cfg.sample_size)
    scored, score_s = [], []
    while len(scored) < cfg.population or time.perf_counter() - start + retrain_guess < budget:
        arch = strategy.ask()
        path = supernet.as_path(arch)
        metrics, seconds = timed(scorer, path)
        result = TrialResult(val_ne=metrics["ne"], mflops=supernet.path_flops(path) / 1e6)
        strategy.tell(arch, result)
        scored.append((arch, result))
        score_s.append(seconds)
    best = best_scored(scored, objective, 1)[0]
    out, scratch_s = timed(run_trial, best, data, train_cfg)
    _, best_score_s = timed(scorer, supernet.as_path(best))  # the same child, scored once more
    return {"arch": best, "result": out.result, "wall_s": time.perf_counter() - start, "children": len(scored),
            "score_s": statistics.median(score_s), "best_score_s": best_score_s, "scratch_s": scratch_s}


def run_evolution(space: Any, data: Any, train_cfg: Any, objective: Objective, args: argparse.Namespace,
                  budget: float) -> dict:
    """Regularized evolution, every candidate trained from scratch, until the budget is spent."""
    strategy = build_strategy("evolution", space, seed=args.seed, objective=objective,
                              population=max(2, args.population // 4), sample_size=2)
    start, trained = time.perf_counter(), []
    while not trained or time.perf_counter() - start < budget:
        arch = strategy.ask()
        out = run_trial(arch, data, train_cfg)
        strategy.tell(arch, out.result)
        trained.append((arch, out.result))
        print(f"  evolution trial {len(trained)}: {out.result.status}, {time.perf_counter() - start:.0f} s", flush=True)
    ok = [(a, r) for a, r in trained if r.ok]
    arch, result = min(ok, key=lambda ar: objective(ar[1])) if ok else trained[0]
    return {"arch": arch, "result": result, "wall_s": time.perf_counter() - start, "trials": len(trained),
            "train_s": [r.train_seconds for _, r in ok]}


def row(name: str, result: TrialResult, wall_s: float | None, note: str = "") -> str:
    if not result.ok:
        return f"  {name:10s} FAILED: {result.error}"
    wall = f"{wall_s:8.0f}" if wall_s is not None else f"{'':8s}"
    return (f"  {name:10s} {result.test_ne:8.4f} {result.test_auc:9.4f} {result.mflops:9.3f} {wall}  {note}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", action="store_true", help="default dnas/oneshot searches on 100k rows x 10 fields")
    parser.add_argument("--strategies", default="dnas,oneshot", help="with --cost: the strategies, comma-separated")
    parser.add_argument("--steps", type=int, default=300, help="steps per candidate and per supernet")
    parser.add_argument("--rows", type=int, default=0, help="synthetic rows (0: the default data.rows)")
    parser.add_argument("--population", type=int, default=16, help="one-shot evolution population")
    parser.add_argument("--target-mflops", type=float, help="FLOPs target of the objective (relaxed penalty)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --cost: a config override for every search (e.g. search.dnas.estimator=gumbel)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"steps": 6, "rows": 3000, "population": 4}, argv)
    if args.cost:
        cost_bench(args.strategies.split(","), args.threads, args.set)
        return
    torch.set_num_threads(args.threads)
    cfg = load_config(overrides=[f"train.steps={args.steps}", "train.progress=false",
                                 *([f"data.rows={args.rows}"] if args.rows else [])])
    train_cfg = replace(cfg.train, val_every=max(1, args.steps // 3))
    data = open_data("synthetic", cfg.data, progress=True)
    space = get_space("nasrec", **(QUICK_SPACE if args.quick else {}))
    objective = Objective(target_mflops=args.target_mflops, penalty="relaxed")
    print(f"space nasrec{' (quick menu)' if args.quick else ''}, {args.steps} steps x {train_cfg.batch_size} rows, "
          f"{args.threads} thread(s), data {data.path}")

    dnas = run_dnas(space, data, train_cfg, objective, args)
    budget = dnas["wall_s"]
    oneshot = run_oneshot(space, data, train_cfg, objective, args, budget, dnas["cand_s"])
    evolution = run_evolution(space, data, train_cfg, objective, args, budget)
    baselines = {name: run_trial(get_baseline(name, data.spec), data, train_cfg).result for name in BASELINES}

    typical = statistics.median(evolution["train_s"] or [dnas["cand_s"]])
    print(f"\n1. DNAS: search {dnas['search_s']:.1f} s ({args.steps} weight steps + {dnas['arch_steps']} architecture "
          f"steps, supernet of {dnas['supernet_params'] / 1e6:.1f}M weights) / one candidate trained for "
          f"{args.steps} steps: the derived one {dnas['cand_s']:.1f} s = {dnas['search_s'] / dnas['cand_s']:.2f}x; "
          f"the median evolution candidate {typical:.1f} s = {dnas['search_s'] / typical:.2f}x (goal <= 3)")
    print(f"2. one-shot: scoring a child {oneshot['best_score_s']:.2f} s (median over {oneshot['children']} "
          f"children {oneshot['score_s']:.2f} s) vs training it from scratch and scoring it "
          f"{oneshot['scratch_s']:.1f} s: {oneshot['scratch_s'] / oneshot['best_score_s']:.0f}x cheaper (goal >= 50x)")
    bayes = data.split("test").bayes_ne
    print(f"3. quality on the test split (budget {budget:.0f} s per search; Bayes-optimal NE {bayes:.4f})")
    print(f"  {'name':10s} {'test NE':>8s} {'test AUC':>9s} {'MFLOPs':>9s} {'wall s':>8s}")
    print(row("dnas", dnas["result"], dnas["wall_s"], dnas["arch"].hash))
    print(row("oneshot", oneshot["result"], oneshot["wall_s"],
              f"{oneshot['arch'].hash}, {oneshot['children']} children scored"))
    print(row("evolution", evolution["result"], evolution["wall_s"],
              f"{evolution['arch'].hash}, {evolution['trials']} trials"))
    for name, result in baselines.items():
        print(row(name, result, result.train_seconds, "baseline (train time)"))


if __name__ == "__main__":
    main()
