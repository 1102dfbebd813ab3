"""``rankitect train``: train one architecture (a genotype file or a baseline) and log it to MLflow.

With ``runtime.sharding=torchrec`` under ``torchrun``, one process per rank trains with sharded
embedding tables (:mod:`rankitect.train.sharding`).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from rankitect.cli.arguments import add_config_args, load_arch, set_threads
from rankitect.cli.tracked import data_params
from rankitect.config import Config
from rankitect.errors import UserError


def add_commands(sub: Any) -> None:
    train = sub.add_parser("train", help="train one architecture and log it to MLflow")
    train.add_argument("--arch", required=True, help="a genotype JSON file or baseline:NAME")
    train.add_argument("--steps", type=int)
    add_config_args(train)
    train.set_defaults(handler=cmd_train, flags={"steps": "train.steps"})


def cmd_train(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.eval.result import TrialResult
    from rankitect.space.flops import cost
    from rankitect.track import Tracker
    from rankitect.track.names import COMMAND
    from rankitect.track.location import store_args
    from rankitect.train.loop import train_architecture
    from rankitect.train.task import TrialDiverged

    set_threads(cfg)
    if cfg.runtime.sharding == "torchrec":
        return _train_sharded(args, cfg)
    data = open_data(cfg.data.source, cfg.data, progress=True)
    arch = load_arch(args.arch, data.spec, cfg)
    c = cost(arch, data.spec)
    budget = f"at most {cfg.train.steps} steps" if cfg.train.steps else f"at most {cfg.train.max_epochs} epochs"
    print(f"training {arch.hash}: {c.mflops:.3f} MFLOPs/example, {c.params:,} params, {budget}")
    try:
        out = train_architecture(arch, data, cfg.train, runtime=cfg.runtime)
    except TrialDiverged as e:
        raise UserError(f"training {arch.hash} failed: {e}") from None
    result = TrialResult.from_metrics(out.metrics, mflops=c.mflops, params=c.params, train_seconds=out.train_seconds)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    run_id = tracker.log_trial(None, arch, result, {COMMAND: "train"}, params=data_params(cfg),
                               start_time=time.time() - out.train_seconds)
    tracker.log_model(run_id, out.model.state_dict(), data.spec)
    for k, v in sorted(out.metrics.items()):
        print(f"{k:18s} {v:.4f}")
    store = store_args(tracker.uri)
    print(f"MLflow run: {run_id}  (rankitect export {run_id} -o DIR{store}; rankitect finetune {run_id}{store})")
    return 0


def _train_sharded(args: argparse.Namespace, cfg: Config) -> int:
    """``rankitect train`` with torchrec-sharded tables, one process per rank under torchrun."""
    from rankitect.eval.result import TrialResult
    from rankitect.space.flops import cost
    from rankitect.train.sharding import init_distributed, open_data_in_turn, shutdown, train_distributed

    env = init_distributed(cfg.runtime.device)
    try:
        data = open_data_in_turn(env, cfg.data.source, cfg.data)
        arch = load_arch(args.arch, data.spec, cfg)
        c = cost(arch, data.spec)
        if env.is_main:
            print(f"training {arch.hash} on {env.world_size} rank(s), tables sharded by torchrec: "
                  f"{c.mflops:.3f} MFLOPs/example, {c.params:,} params, {cfg.train.steps} steps")
        out = train_distributed(arch, data, cfg.train, env)
        # Keep the numbers, drop the sharded model (its DDP reducer and torchrec modules hold the
        # process group) while every rank is still in the group.
        losses, metrics, seconds, steps, plan = out.losses, out.metrics, out.train_seconds, out.steps, out.plan
        del out
        gc.collect()
    finally:
        # Every rank leaves the group before rank 0 writes to MLflow, so no rank idles in a
        # collective for as long as the tracking store takes.
        shutdown(env)
    if not env.is_main:
        return 0
    from rankitect.track import Tracker
    from rankitect.track.names import COMMAND, WORLD_SIZE

    print(plan)
    result = TrialResult.from_metrics(metrics, mflops=c.mflops, params=c.params, train_seconds=seconds)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    run_id = tracker.log_trial(None, arch, result, {COMMAND: "train", WORLD_SIZE: str(env.world_size)},
                               params=data_params(cfg), start_time=time.time() - seconds)
    tracker.log_per_step(run_id, "train/loss", losses)
    print(f"train/loss first {losses[0]:.4f} last {losses[-1]:.4f} ({steps} steps)")
    for k, v in sorted(metrics.items()):
        print(f"{k:18s} {v:.4f}")
    print(f"MLflow run: {run_id}")
    return 0
