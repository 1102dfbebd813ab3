"""The training protocol against a plain early-stopped loop, and pruning under a wall-clock budget.

    python -m bench.quality.protocol_bench --part twins            # baselines vs plain twins, 3 seeds
    python -m bench.quality.protocol_bench --part pruning --budget 4m
    python -m bench.quality.protocol_bench --data adult --seeds 0 1 2 --threads 1
    python -m bench.quality.protocol_bench --part curves --data synthetic --rows 200000 --models deepfm dhen

1. ``twins``: rankitect's DeepFM, DCNv2 and DLRM trained under the protocol (Lightning, early
   stopping, best state restored; :func:`rankitect.train.loop.train_architecture`) against a plain
   PyTorch loop written here: same model, optimizers and batches, validation every epoch, stop after
   ``patience`` epochs without a better validation NE, best weights restored. Also the previous
   protocol (a fixed ``--fixed-steps`` steps, last weights) for reference. Test NE, mean and spread
   over the seeds, per data set: ``../shared/data/adult.csv`` (real) and the synthetic default.
2. ``pruning``: evolution searches with and without pruning under one ``--budget`` each (the same
   baselines in both), per seed: test NE of the found model (the candidate with the best
   validation NE), candidates trained and candidates per hour.
3. ``curves``: the validation NE of every validation of each baseline and seed, trained under the
   protocol with the hopeless rule (not once below NE 1 by the end of ``train.grace_steps``)
   deferred to the end of training: whether a model the default rule stops at its first
   validation would have recovered, and how the others go on after their best.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import SHARED_DATA, parse_args
from bench.plain import plain_model, plain_step
from rankitect.config import TrainConfig, load_config
from rankitect.data import open_data
from rankitect.data.clickdata import epoch_batches
from rankitect.eval.evaluate import evaluate
from rankitect.space.baselines import get_baseline
from rankitect.train.loop import train_architecture
from rankitect.train.protocol import Schedule
from rankitect.train.task import TrialDiverged

MODELS = ("deepfm", "dcnv2", "dlrm")


def open_set(name: str, rows: int):
    if name == "adult":
        return open_data(str(SHARED_DATA / "adult.csv"), schema=str(SHARED_DATA / "adult.yaml"))
    return open_data("synthetic", rows=rows, progress=True)


def plain_twin(arch, data, cfg: TrainConfig, *, fixed_steps: int | None = None) -> dict[str, float]:
    """A plain loop: epochs, validation NE after each, stop after ``patience`` epochs without a
    better one, best weights back; with ``fixed_steps``: that many steps and the last weights."""
    model, opts = plain_model(arch, data, cfg)
    val = lambda: data.split("val").batches(cfg.batch_size, shuffle=False)  # noqa: E731
    best, best_state, bad, step = math.inf, None, 0, 0
    for epoch in range(cfg.max_epochs if fixed_steps is None else 10**6):
        for batch in data.split("train").batches(cfg.batch_size, shuffle=True, seed=cfg.seed + epoch, merge_last=True):
            plain_step(model, opts, batch)
            step += 1
            if fixed_steps is not None and step >= fixed_steps:
                break
        if fixed_steps is not None:
            if step >= fixed_steps:
                break
            continue
        ne = evaluate(model, val())["ne"]
        if ne < best:
            best, best_state, bad = ne, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    test = evaluate(model, data.split("test").batches(cfg.batch_size, shuffle=False))
    return {"test_ne": test["ne"], "epochs": epoch + 1}


def _stats(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.4f} ± {sd:.4f}"


def twins(args: argparse.Namespace) -> None:
    print(f"\n== protocol vs plain early-stopped twin (test NE, mean ± sd over seeds {args.seeds}) ==")
    head = f"{'data':10s} {'model':7s} {'protocol':>17s} {'plain twin':>17s} {'diff':>8s} {'fixed ' + str(args.fixed_steps):>17s} {'epochs':>6s}"
    print(head)
    for name in args.data:
        data = open_set(name, args.rows)
        cfg = replace(load_config().train, progress=False)
        for model in args.models:
            arch = get_baseline(model, data.spec)
            ours, twin, fixed, epochs = [], [], [], []
            for seed in args.seeds:
                c = replace(cfg, seed=seed)
                out = train_architecture(arch, data, c)
                ours.append(out.metrics["test/ne"])
                epochs.append(out.steps / epoch_batches(len(data.split("train")), c.batch_size))
                twin.append(plain_twin(arch, data, c)["test_ne"])
                if args.fixed_steps:
                    fixed.append(plain_twin(arch, data, c, fixed_steps=args.fixed_steps)["test_ne"])
            diff = statistics.mean(ours) - statistics.mean(twin)
            print(f"{name:10s} {model:7s} {_stats(ours):>17s} {_stats(twin):>17s} {diff:+8.4f} "
                  f"{_stats(fixed) if fixed else '-':>17s} {statistics.mean(epochs):6.1f}", flush=True)


def curves(args: argparse.Namespace) -> None:
    print(f"\n== validation NE at every validation, the hopeless rule deferred to the end (seeds {args.seeds}) ==")
    print(f"{'data':10s} {'model':7s} {'seed':>4s} {'best val':>8s} {'test':>7s} {'default rule':>12s}  curve")
    for name in args.data:
        data = open_set(name, args.rows)
        cfg = replace(load_config().train, progress=False)
        for model in args.models:
            arch = get_baseline(model, data.spec)
            for seed in args.seeds:
                c = replace(cfg, seed=seed)
                c = replace(c, grace_steps=Schedule.for_data(c, data).total_steps)
                try:
                    out = train_architecture(arch, data, c)
                except TrialDiverged as e:
                    print(f"{name:10s} {model:7s} {seed:4d} failed: {e}", flush=True)
                    continue
                curve = [h["val/ne"] for h in out.history]
                rule = "stops it" if curve[0] >= 1.0 and cfg.grace_steps <= out.history[0]["step"] else "-"
                print(f"{name:10s} {model:7s} {seed:4d} {out.metrics['val/ne']:8.4f} {out.metrics['test/ne']:7.4f} "
                      f"{rule:>12s}  " + " ".join(f"{x:.4f}" for x in curve), flush=True)


def pruning(args: argparse.Namespace) -> None:
    from rankitect.search.running.runner import SearchRunner

    print(f"\n== evolution with and without pruning, {args.budget} each, data {args.data} ==")
    print(f"{'data':10s} {'seed':>4s} {'pruning':8s} {'found test NE':>13s} {'candidates':>10s} {'pruned':>6s} "
          f"{'cand/hour':>9s} {'minutes':>7s}")
    summary: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name in args.data:
        source = ([f"data.source={SHARED_DATA / 'adult.csv'}", f"data.schema={SHARED_DATA / 'adult.yaml'}"] if name == "adult"
                  else [f"data.rows={args.rows}"])
        for seed in args.seeds:
            for mode in ("none", "asha"):
                with tempfile.TemporaryDirectory() as tmp:
                    cfg = load_config(overrides=[
                        *source, "search.strategy=evolution", f"search.seed={seed}", f"train.seed={seed}",
                        "search.trials=1000", f"search.time_budget={args.budget}", f"search.pruning={mode}",
                        f"search.baselines={args.baselines}", f"track.uri=sqlite:///{tmp}/m.db",
                        f"search.output_dir={tmp}/out"])
                    start = time.perf_counter()
                    runner = SearchRunner(cfg, echo=lambda line: None)
                    outcome = runner.run()
                    minutes = (time.perf_counter() - start) / 60
                cands = outcome.table[outcome.table["kind"] == "candidate"]
                ok = cands[cands["status"] == "ok"]
                found = ok.loc[ok["val_ne"].idxmin(), "test_ne"] if len(ok) else math.nan
                cand_minutes = outcome.spending["total"] / 60 - outcome.spending["baselines"] / 60
                per_hour = len(cands) / max(cand_minutes, 1e-9) * 60
                summary.setdefault((name, mode), []).append((found, per_hour))
                print(f"{name:10s} {seed:4d} {mode:8s} {found:13.4f} {len(cands):10d} "
                      f"{int((cands['status'] == 'pruned').sum()):6d} {per_hour:9.1f} {minutes:7.1f}", flush=True)
    print("\nmean over seeds:")
    for name in args.data:
        rows = {m: summary.get((name, m), []) for m in ("none", "asha")}
        if not all(rows.values()):
            continue
        ne = {m: _stats([r[0] for r in rows[m]]) for m in rows}
        rate = {m: statistics.mean(r[1] for r in rows[m]) for m in rows}
        print(f"  {name}: found test NE  no pruning {ne['none']}  pruning {ne['asha']};  candidates/hour "
              f"{rate['none']:.1f} vs {rate['asha']:.1f} (ratio {rate['asha'] / rate['none']:.2f})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["twins", "pruning", "curves", "all"], default="all")
    p.add_argument("--data", nargs="+", default=["adult", "synthetic"], choices=["adult", "synthetic"])
    p.add_argument("--rows", type=int, default=100_000, help="synthetic rows")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--models", nargs="+", default=list(MODELS), help="baselines of the twins and curves parts")
    p.add_argument("--fixed-steps", type=int, default=300, help="the previous fixed-step protocol (0: skip)")
    p.add_argument("--budget", default="4m", help="wall clock of each pruning-bench search")
    p.add_argument("--baselines", default="[dlrm,deepfm]", help="baselines of each pruning-bench search")
    p.add_argument("--threads", type=int, default=1)
    args = parse_args(p, {"data": ["synthetic"], "rows": 3000, "seeds": [0], "models": ["dlrm"],
                          "fixed_steps": 5, "budget": "10s", "baselines": "[dlrm]"}, argv)
    torch.set_num_threads(args.threads)
    if args.part in ("twins", "all"):
        twins(args)
    if args.part in ("pruning", "all"):
        pruning(args)
    if args.part in ("curves", "all"):
        curves(args)


if __name__ == "__main__":
    main()
