"""``rankitect finetune RUN``: train a tracked model further, logged as a new run nested under it.

The model starts from the run's weights, from the weights cut out of its search's supernet
(``--from-supernet``), or fresh (``--from-scratch``); :func:`rankitect.train.finetune.finetune_model`
trains it and keeps the starting weights when training did not lower the validation NE. The new run
is tagged with the run it came from (:data:`~rankitect.track.names.FINETUNED_FROM`) and keeps its
weights.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from rankitect.cli.arguments import add_config_args, set_threads
from rankitect.cli.tracked import data_of_run, data_params, open_tracker
from rankitect.config import Config
from rankitect.errors import UserError
from rankitect.track.names import COMMAND, FINETUNED_FROM, KEPT, KIND, KIND_FINETUNE, START


def add_commands(sub: Any) -> None:
    finetune = sub.add_parser("finetune", help="train a tracked model further, as a new run")
    finetune.add_argument("run_id", help="a candidate's or baseline's run id, or a search run (its winner)")
    finetune.add_argument("--steps", type=int, help="training steps (default: train.steps)")
    start = finetune.add_mutually_exclusive_group()
    start.add_argument("--from-scratch", action="store_true", help="re-initialize instead of loading weights")
    start.add_argument("--from-supernet", action="store_true",
                       help="start from the weights cut out of the search's supernet (oneshot, dnas)")
    add_config_args(finetune)
    finetune.set_defaults(handler=cmd_finetune, flags={"steps": "train.steps"})


def cmd_finetune(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import open_data
    from rankitect.track.location import store_args

    set_threads(cfg)
    tracker = open_tracker(cfg)
    cfg.data = data_of_run(args, cfg, tracker, args.run_id, "finetune")
    data = open_data(cfg.data.source, cfg.data, progress=True)
    new_id, source_id, outcome = finetune_run(tracker, args.run_id, data, cfg, from_scratch=args.from_scratch,
                                              from_supernet=args.from_supernet)
    print(f"{'metric':18s} {'before':>8s} {'after':>8s}")
    for k in ("val/ne", "test/ne", "test/auc", "test/logloss"):
        print(f"{k:18s} {outcome.before[k]:8.4f} {outcome.after[k]:8.4f}")
    print(outcome.verdict())
    print(f"MLflow run: {new_id} (nested under {source_id}; rankitect export {new_id} -o DIR{store_args(tracker.uri)})")
    return 0


def finetune_run(
    tracker: Any, run_id: str, data: Any, cfg: Config, *, from_scratch: bool = False, from_supernet: bool = False,
) -> tuple[str, str, Any]:
    """Fine-tune the model of ``run_id`` (a candidate, baseline or search run: its winner) on ``data``
    and log it as a run nested under the run it came from, with the weights it keeps.
    Returns the new run's id, the source run's id and the :class:`~rankitect.train.finetune.FinetuneOutcome`."""
    from dataclasses import replace

    import torch

    from rankitect.data.spec import FeatureSpec
    from rankitect.search.running.progress import TrainingProgress
    from rankitect.export.exporter import read_state_dict
    from rankitect.eval.result import TrialResult
    from rankitect.space import build_model
    from rankitect.space.architecture import read_genotype
    from rankitect.space.flops import cost
    from rankitect.space.pricing import check_fits
    from rankitect.train.finetune import check_same_features, finetune_model

    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(run_id, tmp)
        arch = read_genotype(files.genotype)
        trained = FeatureSpec.load(files.spec)
        check_fits(arch, data.spec, cfg.runtime.memory_budget, cfg.train.batch_size, where=f"finetune {run_id}: ")
        check_same_features(trained, data.spec, f"finetune {run_id}")
        spec = data.spec if from_scratch else data.spec.with_dense_stats_of(trained)  # inputs as the weights saw them
        with torch.random.fork_rng():
            torch.manual_seed(cfg.train.seed)
            model = build_model(arch, spec)
            if from_supernet:
                model.load_state_dict(_supernet_weights(tracker, files.run_id, arch, Path(tmp) / "supernet"))
            elif not from_scratch:
                model.load_state_dict(read_state_dict(files.weights))  # unreadable: a one-line DataError
            # one line with the epoch and step of a known total instead of Lightning's bar
            progress = TrainingProgress("finetune") if cfg.train.progress else None
            try:
                outcome = finetune_model(model, data, replace(cfg.train, progress=False), from_scratch=from_scratch,
                                         runtime=cfg.runtime, on_step=progress)
            finally:
                if progress is not None:
                    progress.close()
    c = cost(arch, data.spec)
    result = TrialResult.from_metrics(outcome.after, mflops=c.mflops, params=c.params,
                                      train_seconds=outcome.train_seconds)
    start = "scratch" if from_scratch else "supernet" if from_supernet else "own weights"
    tags = {FINETUNED_FROM: files.run_id, COMMAND: "finetune", KIND: KIND_FINETUNE, START: start,
            KEPT: "start" if outcome.kept_start else "finetuned"}
    new_id = tracker.log_trial(files.run_id, arch, result, tags, params=data_params(cfg), history=outcome.history)
    tracker.log_model(new_id, model.state_dict(), spec)
    return new_id, files.run_id, outcome


def _supernet_weights(tracker: Any, run_id: str, arch: Any, dst: Path) -> dict[str, Any]:
    """``arch``'s weights cut from the supernet its search trained (a one-shot or DNAS search)."""
    from rankitect.supernet.train import SUPERNET_DIR, load_supernet

    folder = tracker.fetch_search_artifact(run_id, "supernet", SUPERNET_DIR, dst)
    if folder is None:
        raise UserError(f"finetune {run_id} --from-supernet: its search kept no supernet (only oneshot and dnas do)")
    return load_supernet(folder).extract(arch).state_dict()
