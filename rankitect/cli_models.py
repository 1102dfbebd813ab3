"""The ``rankitect`` commands that act on one model: train, export, finetune, probe.

Kept apart from :mod:`rankitect.cli` (the parser, data, search, runs and ui) to keep both short.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from rankitect.config import Config
from rankitect.errors import UserError


def set_threads(cfg: Config) -> None:
    if cfg.runtime.threads > 0:
        import torch

        torch.set_num_threads(cfg.runtime.threads)


def cmd_train(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.search.base import TrialResult
    from rankitect.space.flops import cost
    from rankitect.track import Tracker
    from rankitect.train.loop import train_architecture

    set_threads(cfg)
    if cfg.runtime.sharding == "torchrec":
        return _train_sharded(args, cfg)
    data = open_data(cfg.data.source, cfg.data, progress=True)
    arch = _load_arch(args.arch, data.spec)
    c = cost(arch, data.spec)
    print(f"training {arch.hash}: {c.mflops:.3f} MFLOPs/example, {c.params:,} params, {cfg.train.steps} steps")
    out = train_architecture(arch, data, cfg.train, runtime=cfg.runtime)
    result = TrialResult.from_metrics(out.metrics, mflops=c.mflops, params=c.params, train_seconds=out.train_seconds)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    run_id = tracker.log_trial(None, arch, result, {"rankitect.command": "train"})
    _attach_weights(tracker, run_id, out.model, data.spec)
    for k, v in sorted(out.metrics.items()):
        print(f"{k:18s} {v:.4f}")
    print(f"MLflow run: {run_id}")
    return 0


def _train_sharded(args: argparse.Namespace, cfg: Config) -> int:
    """``rankitect train`` with torchrec-sharded tables, one process per rank under torchrun."""
    from rankitect.search.base import TrialResult
    from rankitect.space.flops import cost
    from rankitect.train.sharding import init_distributed, open_data_in_turn, shutdown, train_distributed

    env = init_distributed(cfg.runtime.device)
    try:
        data = open_data_in_turn(env, cfg.data.source, cfg.data)
        arch = _load_arch(args.arch, data.spec)
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

    print(plan)
    result = TrialResult.from_metrics(metrics, mflops=c.mflops, params=c.params, train_seconds=seconds)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    run_id = tracker.log_trial(None, arch, result, {"rankitect.command": "train",
                                                    "rankitect.world_size": str(env.world_size)})
    _log_loss_curve(tracker, run_id, losses)
    print(f"train/loss first {losses[0]:.4f} last {losses[-1]:.4f} ({steps} steps)")
    for k, v in sorted(metrics.items()):
        print(f"{k:18s} {v:.4f}")
    print(f"MLflow run: {run_id}")
    return 0


def _log_loss_curve(tracker: Any, run_id: str, losses: list[float]) -> None:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    tracker.client.log_batch(run_id, metrics=[Metric("train/loss", v, now, i) for i, v in enumerate(losses)])


def _attach_weights(tracker: Any, run_id: str, model: Any, spec: Any) -> None:
    import tempfile

    from rankitect.track.weights import save_weights

    with tempfile.TemporaryDirectory() as tmp:
        weights = save_weights(model.state_dict(), Path(tmp) / "model.safetensors")
        spec_file = Path(tmp) / "spec.json"
        spec.save(spec_file)
        tracker.log_model_files(run_id, weights, spec_file)


def _load_arch(ref: str, spec: Any) -> Any:
    from rankitect.space.architecture import Architecture

    if ref.startswith("baseline:"):
        from rankitect.space.baselines import BASELINES, get_baseline

        name = ref.split(":", 1)[1]
        if name not in BASELINES:
            raise UserError(f"--arch {ref}: unknown baseline {name!r}; known: {sorted(BASELINES)}")
        return get_baseline(name, spec)
    path = Path(ref)
    if not path.is_file():
        raise UserError(f"--arch {ref}: no such file (give a genotype JSON or baseline:NAME)")
    from rankitect.space.flops import cost

    try:
        arch = Architecture.from_json(path.read_text())
        cost(arch, spec)  # builds it without weights: an unknown op, activation or size is refused here
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path}: not a valid genotype: {e}") from None
    return arch


def cmd_export(args: argparse.Namespace, cfg: Config) -> int:
    import tempfile

    from rankitect.export import export_from_files
    from rankitect.track import Tracker

    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(args.run_id, tmp)
        out = export_from_files(files.genotype, files.spec, files.weights, args.output)
    print(f"exported run {files.run_id} to {out} (model.py imports only torch: load(directory) gives the module)")
    return 0


def cmd_finetune(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.export.finetune import finetune
    from rankitect.track import Tracker

    set_threads(cfg)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    data = open_data(cfg.data.source, cfg.data, progress=True)
    outcome = finetune(tracker, args.run_id, data, cfg.train, from_scratch=args.from_scratch,
                       from_supernet=args.from_supernet, runtime=cfg.runtime)
    print(f"{'metric':18s} {'before':>8s} {'after':>8s}")
    for k in ("test/ne", "test/auc", "test/logloss", "val/ne"):
        print(f"{k:18s} {outcome.before[k]:8.4f} {outcome.after[k]:8.4f}")
    print(f"MLflow run: {outcome.run_id} (fine-tuned from {outcome.source_run_id})")
    return 0


def cmd_probe(args: argparse.Namespace, cfg: Config) -> int:
    from itertools import islice

    from rankitect.data import open_data
    from rankitect.train.fp8 import probe_model

    set_threads(cfg)
    data = open_data(cfg.data.source, cfg.data, progress=True)
    model, what = _probe_target(args, cfg, data)
    batches = data.split("train").batches(cfg.train.batch_size, shuffle=True, seed=cfg.train.seed)
    report = probe_model(model, islice(batches, args.batches), threshold=cfg.runtime.fp8_threshold,
                         scaling=cfg.runtime.fp8_scaling)
    print(f"FP8 probe of {what}: relative error of each linear's output with weights and inputs in "
          "float8_e4m3fn (emulated)")
    print(report.table().to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(report.summary())
    return 0


def _probe_target(args: argparse.Namespace, cfg: Config, data: Any) -> tuple[Any, str]:
    """The model to probe: a genotype file or baseline (random init, or ``--steps`` of training
    first), else a tracked run's trained weights."""
    import tempfile

    import torch

    from rankitect.space import build_model

    target = args.target
    if target.startswith("baseline:") or target.endswith(".json") or Path(target).is_file():
        arch = _load_arch(target, data.spec)
        if args.steps:
            from dataclasses import replace

            from rankitect.train.loop import train_architecture

            out = train_architecture(arch, data, replace(cfg.train, steps=args.steps))
            return out.model, f"{target} ({arch.hash}) after {args.steps} training steps"
        with torch.random.fork_rng():
            torch.manual_seed(cfg.train.seed)
            return build_model(arch, data.spec), f"{target} ({arch.hash}, random init)"
    from rankitect.data.spec import FeatureSpec
    from rankitect.export.exporter import read_state_dict
    from rankitect.export.finetune import check_same_features
    from rankitect.space.architecture import Architecture
    from rankitect.track import Tracker

    with tempfile.TemporaryDirectory() as tmp:
        files = Tracker(cfg.track.uri, cfg.track.experiment).fetch_model_files(target, tmp)
        check_same_features(FeatureSpec.load(files.spec), data.spec, f"probe {target}")
        model = build_model(Architecture.from_json(files.genotype.read_text()), data.spec)
        model.load_state_dict(read_state_dict(files.weights))  # an unreadable file: one-line DataError
    return model, f"run {files.run_id}"
