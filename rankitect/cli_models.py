"""The ``rankitect`` commands that act on one model: train, export, finetune, probe.

Kept apart from :mod:`rankitect.cli` (the parser, data, search, runs and ui) to keep both short.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

from rankitect.config import Config, DataConfig, config_from_dict, flatten, to_dict
from rankitect.errors import UserError

# Data settings that decide what a model sees (``cache_dir`` only says where the cache lives).
DATA_KEYS = tuple(k for k in DataConfig.__dataclass_fields__ if k != "cache_dir")


def set_threads(cfg: Config) -> None:
    if cfg.runtime.threads > 0:
        import torch

        torch.set_num_threads(cfg.runtime.threads)


def open_tracker(cfg: Config) -> Any:
    """The tracker of ``cfg.track``; a SQLite store that does not exist is an error naming it
    (reading commands never create an empty store)."""
    from rankitect.track import Tracker, resolve_uri
    from rankitect.track.store import store_exists

    uri = resolve_uri(cfg.track.uri)
    if not store_exists(uri):
        raise UserError(f"no run store at {uri} (name one with track.uri=... or $MLFLOW_TRACKING_URI)")
    return Tracker(uri, cfg.track.experiment)


def data_params(cfg: Config) -> dict[str, str]:
    """The data settings of ``cfg`` as the run parameters ``data.*`` (what finetune and probe read back)."""
    return {f"data.{k}": str(v) for k, v in flatten(to_dict(cfg.data)).items()}


def logged_data_config(tracker: Any, run_id: str) -> tuple[DataConfig | None, str]:
    """The data settings logged on ``run_id`` or, for a candidate, on its search; ``None`` when the
    run predates their logging. Also returns the id of the run that holds them."""
    from rankitect.track.mlflow_tracker import PARENT

    run = tracker.get_run(run_id)
    holder = run
    while not any(k.startswith("data.") for k in holder.data.params) and holder.data.tags.get(PARENT):
        holder = tracker.get_run(holder.data.tags[PARENT])
    logged = {k[len("data."):]: v for k, v in holder.data.params.items() if k.startswith("data.")}
    if not logged:
        return None, run.info.run_id
    raw = {k: None if v == "None" else v for k, v in logged.items() if k in DataConfig.__dataclass_fields__}
    overrides = [f"data.{k}={'' if v is None else v}" for k, v in raw.items()]
    return config_from_dict({}, overrides).data, holder.info.run_id


def data_of_run(args: argparse.Namespace, cfg: Config, tracker: Any, run_id: str, what: str) -> DataConfig:
    """The data a command on ``run_id`` uses: the settings logged on the run. A ``data.*`` setting
    given on the command line (or in ``-c FILE``) that differs is an error naming both values."""
    logged, holder = logged_data_config(tracker, run_id)
    if logged is None:
        print(f"note: run {run_id} logged no data settings; using data.source={cfg.data.source}")
        return cfg.data
    explicit = getattr(args, "explicit", set())
    for key in DATA_KEYS:
        given, used = getattr(cfg.data, key), getattr(logged, key)
        if f"data.{key}" in explicit and given != used:
            raise UserError(f"{what} {run_id}: data.{key}={given} was given, but run {holder} was trained "
                            f"with data.{key}={used} (leave data.{key} out to use the run's data)")
    cache_dir = cfg.data.cache_dir if "data.cache_dir" in explicit else logged.cache_dir
    return DataConfig(**{**{k: getattr(logged, k) for k in DATA_KEYS}, "cache_dir": cache_dir})


def cmd_train(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.search.base import TrialResult
    from rankitect.space.flops import cost
    from rankitect.track import Tracker
    from rankitect.train.loop import train_architecture
    from rankitect.train.task import TrialDiverged

    set_threads(cfg)
    if cfg.runtime.sharding == "torchrec":
        return _train_sharded(args, cfg)
    data = open_data(cfg.data.source, cfg.data, progress=True)
    arch = _load_arch(args.arch, data.spec)
    c = cost(arch, data.spec)
    budget = f"at most {cfg.train.steps} steps" if cfg.train.steps else f"at most {cfg.train.max_epochs} epochs"
    print(f"training {arch.hash}: {c.mflops:.3f} MFLOPs/example, {c.params:,} params, {budget}")
    try:
        out = train_architecture(arch, data, cfg.train, runtime=cfg.runtime)
    except TrialDiverged as e:
        raise UserError(f"training {arch.hash} failed: {e}") from None
    result = TrialResult.from_metrics(out.metrics, mflops=c.mflops, params=c.params, train_seconds=out.train_seconds)
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    run_id = tracker.log_trial(None, arch, result, {"rankitect.command": "train"}, params=data_params(cfg),
                               start_time=time.time() - out.train_seconds)
    _attach_weights(tracker, run_id, out.model, data.spec)
    for k, v in sorted(out.metrics.items()):
        print(f"{k:18s} {v:.4f}")
    from rankitect.track.store import store_args

    store = store_args(tracker.uri)
    print(f"MLflow run: {run_id}  (rankitect export {run_id} -o DIR{store}; rankitect finetune {run_id}{store})")
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
                                                    "rankitect.world_size": str(env.world_size)},
                               params=data_params(cfg), start_time=time.time() - seconds)
    _log_loss_curve(tracker, run_id, losses)
    print(f"train/loss first {losses[0]:.4f} last {losses[-1]:.4f} ({steps} steps)")
    for k, v in sorted(metrics.items()):
        print(f"{k:18s} {v:.4f}")
    print(f"MLflow run: {run_id}")
    return 0


def _log_loss_curve(tracker: Any, run_id: str, losses: list[float]) -> None:
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

    from rankitect.data import open_data
    from rankitect.export import export_from_files

    tracker = open_tracker(cfg)
    data_cfg = data_of_run(args, cfg, tracker, args.run_id, "export")
    data = open_data(data_cfg.source, data_cfg, progress=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(args.run_id, tmp)
        out = export_from_files(files.genotype, files.spec, files.weights, args.output, data=data)
    print(f"exported run {files.run_id} to {out}: model.py imports only torch; load(directory) gives the "
          "module, load_scorer(directory) scores raw rows")
    return 0


def cmd_finetune(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.export.finetune import finetune
    from rankitect.track.store import store_args

    set_threads(cfg)
    tracker = open_tracker(cfg)
    cfg.data = data_of_run(args, cfg, tracker, args.run_id, "finetune")
    data = open_data(cfg.data.source, cfg.data, progress=True)
    outcome = finetune(tracker, args.run_id, data, cfg.train, from_scratch=args.from_scratch,
                       from_supernet=args.from_supernet, runtime=cfg.runtime, params=data_params(cfg))
    print(f"{'metric':18s} {'before':>8s} {'after':>8s}")
    for k in ("val/ne", "test/ne", "test/auc", "test/logloss"):
        print(f"{k:18s} {outcome.before[k]:8.4f} {outcome.after[k]:8.4f}")
    print(outcome.verdict())
    print(f"MLflow run: {outcome.run_id} (nested under {outcome.source_run_id}; "
          f"rankitect export {outcome.run_id} -o DIR{store_args(tracker.uri)})")
    return 0


def cmd_probe(args: argparse.Namespace, cfg: Config) -> int:
    from itertools import islice

    from rankitect.data import open_data
    from rankitect.train.fp8 import probe_model

    set_threads(cfg)
    tracker = None if _is_genotype(args.target) else open_tracker(cfg)
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


def _is_genotype(target: str) -> bool:
    return target.startswith("baseline:") or target.endswith(".json") or Path(target).is_file()


def _probe_target(args: argparse.Namespace, cfg: Config, data: Any, tracker: Any) -> tuple[Any, str]:
    """The model to probe: a genotype file or baseline (random init, or ``--steps`` of training
    first), else a tracked run's trained weights."""
    import tempfile

    import torch

    from rankitect.space import build_model

    target = args.target
    if tracker is None:
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

    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(target, tmp)
        check_same_features(FeatureSpec.load(files.spec), data.spec, f"probe {target}")
        model = build_model(Architecture.from_json(files.genotype.read_text()), data.spec)
        model.load_state_dict(read_state_dict(files.weights))  # an unreadable file: one-line DataError
    return model, f"run {files.run_id}"
