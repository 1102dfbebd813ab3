"""Search overhead: a trial through the runner (Lightning + MLflow) against a bare training loop.

    python -m bench.speed.search_bench                   # DLRM baseline, 300 steps, 3 reps
    python -m bench.speed.search_bench --steps 50 --reps 7 --trials 0 --threads 1

Prints, in one run on the default synthetic data:

1. per-trial overhead: the same candidate (``--arch``, a baseline) trained for the same steps under
   the training protocol (validations on schedule, best state kept and restored, test scored),
   (a) as the search runner does it — a rung-study ticket, ``run_trial`` through the Lightning task
   reporting every validation, closing the ticket, logging the child run to MLflow — and (b) in a
   bare PyTorch loop with the same optimizers, batches and validations; interleaved repetitions,
   median wall times and their ratio;
2. trials per minute of a real ``evolution`` search on the ``nasrec`` space (``--trials`` trials,
   no baselines), end to end through ``SearchRunner``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import parse_args
from bench.plain import plain_model, plain_step
from rankitect.config import load_config
from rankitect.data import open_data
from rankitect.eval.evaluate import evaluate
from rankitect.eval.result import TrialResult
from rankitect.search.running.runner import SearchRunner
from rankitect.search.judging.pruning import Rungs
from rankitect.search.running.trial import run_trial
from rankitect.space import cost
from rankitect.space.baselines import get_baseline
from rankitect.track import Tracker
from rankitect.train.loop import BatchStream, score
from rankitect.train.protocol import Schedule


def bare_trial(arch, data, cfg) -> dict[str, float]:
    """Train with a plain loop (same optimizers, batches and validations as the protocol's
    schedule, best state kept and restored), then test: the difference is what Lightning, the
    rung study and MLflow add."""
    model, opts = plain_model(arch, data, cfg)
    plan = Schedule.for_data(cfg, data)
    stream = iter(BatchStream(data.split("train"), cfg.batch_size, shuffle=True, seed=cfg.seed, repeat=True))
    best, state = float("inf"), None
    for step in range(1, plan.total_steps + 1):
        plain_step(model, opts, next(stream))
        if step % plan.interval == 0 or step % plan.epoch_steps == 0 or step == plan.total_steps:
            ne = evaluate(model, data.split("val").batches(cfg.batch_size, shuffle=False), cfg.val_batches)["ne"]
            if ne < best:
                best, state = ne, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    return score(model, data, cfg, splits=("test",))


def runner_trial(arch, data, cfg, tracker: Tracker, parent: str, rungs: Rungs) -> TrialResult:
    ticket = rungs.ticket(arch.hash, prune=False)
    out = run_trial(arch, data, cfg, ticket=ticket)
    rungs.close(ticket, out.result)
    tracker.log_trial(parent, arch, out.result)
    return out.result


def overhead(args: argparse.Namespace, data, tmp: str) -> None:
    cfg = replace(load_config(overrides=[f"train.steps={args.steps}"]).train, progress=False)
    arch = get_baseline(args.arch, data.spec)
    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "bench")
    parent = tracker.start_search({"bench": True}, "bench", "bench")
    rungs = Rungs(None, None, Path(tmp) / "rungs.journal", reduction=3, min_validations=1)
    times: dict[str, list[float]] = {"runner": [], "bare": []}
    for _ in range(args.reps):
        for name in ("runner", "bare"):  # interleaved: the machine's noise hits both alike
            start = time.perf_counter()
            if name == "runner":
                runner_trial(arch, data, cfg, tracker, parent, rungs)
            else:
                bare_trial(arch, data, cfg)
            times[name].append(time.perf_counter() - start)
    r, b = statistics.median(times["runner"]), statistics.median(times["bare"])
    print(f"\nper-trial overhead: {args.arch}, {args.steps} steps x {cfg.batch_size} rows, "
          f"{cost(arch, data.spec).mflops:.2f} MFLOPs/example, median of {args.reps}")
    print(f"  {'runner (Lightning + MLflow)':32s} {r:8.2f} s")
    print(f"  {'bare PyTorch loop':32s} {b:8.2f} s")
    print(f"  {'ratio runner / bare':32s} {r / b:8.3f}   (overhead {r - b:+.2f} s per trial)")


def throughput(args: argparse.Namespace, tmp: str) -> None:
    cfg = load_config(overrides=[
        "search.strategy=evolution", "search.space=nasrec", f"search.trials={args.trials}",
        "search.baselines=[]", f"train.steps={args.steps}", f"track.uri=sqlite:///{tmp}/search.db",
        f"search.output_dir={tmp}/searches", *([f"data.rows={args.rows}"] if args.rows else [])])
    start = time.perf_counter()
    SearchRunner(cfg, echo=lambda line: print("  " + line)).run()
    minutes = (time.perf_counter() - start) / 60
    print(f"\nsearch throughput: {args.trials} nasrec trials of {args.steps} steps in {minutes:.2f} min "
          f"= {args.trials / minutes:.2f} trials/minute")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="dlrm", help="baseline timed for the overhead")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--rows", type=int, default=0, help="synthetic rows (0: the default data.rows)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parse_args(p, {"steps": 10, "reps": 1, "trials": 1, "rows": 4000}, argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = open_data("synthetic", rows=args.rows or load_config().data.rows, progress=True)
    with tempfile.TemporaryDirectory() as tmp:
        overhead(args, data, tmp)
        if args.trials:
            throughput(args, tmp)


if __name__ == "__main__":
    main()
