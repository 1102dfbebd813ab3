"""``rankitect probe TARGET``: which linear layers may train in FP8, by the emulated error of each.

The target is a tracked run with kept weights, or a genotype file or ``baseline:NAME`` (random
init, or ``--steps`` of training first); see :func:`rankitect.train.fp8.probe_model`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.cli.arguments import add_config_args, is_genotype_ref, load_arch, set_threads
from rankitect.cli.tracked import data_of_run, open_tracker
from rankitect.config import Config


def add_commands(sub: Any) -> None:
    probe = sub.add_parser("probe", help="which linear layers may train in FP8: emulated error per layer")
    probe.add_argument("target", help="a run with kept weights (candidate, baseline or search: its winner), "
                       "or a genotype JSON file or baseline:NAME (random init)")
    probe.add_argument("--steps", type=int, default=0, help="genotype or baseline: train this many steps first")
    probe.add_argument("--batches", type=int, default=8, help="training batches to probe with (default 8)")
    probe.add_argument("--threshold", type=float, help="largest safe relative error (runtime.fp8_threshold)")
    probe.add_argument("--scaling", choices=["tensorwise", "rowwise"], help="FP8 scaling (runtime.fp8_scaling)")
    add_config_args(probe)
    probe.set_defaults(handler=cmd_probe,
                       flags={"threshold": "runtime.fp8_threshold", "scaling": "runtime.fp8_scaling"})


def cmd_probe(args: argparse.Namespace, cfg: Config) -> int:
    from itertools import islice

    from rankitect.data import open_data
    from rankitect.train.fp8 import probe_model

    set_threads(cfg)
    tracker = None if is_genotype_ref(args.target) else open_tracker(cfg)
    if tracker is not None:
        cfg.data = data_of_run(args, cfg, tracker, args.target, "probe")
    data = open_data(cfg.data.source, cfg.data, progress=True)
    model, what = _probe_target(args, cfg, data, tracker)
    batches = data.split("train").batches(cfg.train.batch_size, shuffle=True, seed=cfg.train.seed)
    report = probe_model(model, islice(batches, args.batches), threshold=cfg.runtime.fp8_threshold,
                         scaling=cfg.runtime.fp8_scaling)
    print(f"FP8 probe of {what}: relative error of each linear's output with weights and inputs in "
          "float8_e4m3fn (emulated)")
    print(report.table().to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(report.summary())
    return 0


def _probe_target(args: argparse.Namespace, cfg: Config, data: Any, tracker: Any) -> tuple[Any, str]:
    """The model to probe: a genotype file or baseline (random init, or ``--steps`` of training
    first), else a tracked run's trained weights."""
    import tempfile

    import torch

    from rankitect.space import build_model

    target = args.target
    if tracker is None:
        arch = load_arch(target, data.spec, cfg)
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
    from rankitect.space.architecture import read_genotype
    from rankitect.space.pricing import check_fits
    from rankitect.train.finetune import check_same_features

    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(target, tmp)
        check_same_features(FeatureSpec.load(files.spec), data.spec, f"probe {target}")
        arch = read_genotype(files.genotype)
        check_fits(arch, data.spec, cfg.runtime.memory_budget, None, where=f"probe {target}: ")
        model = build_model(arch, data.spec)
        model.load_state_dict(read_state_dict(files.weights))  # an unreadable file: one-line DataError
    return model, f"run {files.run_id}"
