"""Fine-tune a tracked model: more steps on the data it was trained on, as a run nested under it.

Training is :func:`rankitect.train.loop.train_model`, the protocol every trained model follows
(early stopping on validation NE with the best state restored, where the loop has it). The model
is scored before and after; if fine-tuning did not lower the validation NE, the run keeps the
weights it started from, and says so.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.data.spec import FeatureSpec
from rankitect.errors import UserError
from rankitect.export.exporter import read_state_dict
from rankitect.space.architecture import Architecture
from rankitect.track.weights import save_weights

FROM_TAG = "rankitect.finetuned_from"


@dataclass
class FinetuneOutcome:
    run_id: str
    source_run_id: str
    before: dict[str, float]
    after: dict[str, float]  # of the weights the new run keeps
    kept_start: bool = False  # fine-tuning did not lower val/ne: the starting weights were kept
    trained: dict[str, float] | None = None  # of the fine-tuned weights, whether kept or not

    def verdict(self) -> str:
        """One line: what fine-tuning did to validation and test NE, and which weights were kept."""
        b, t = self.before, self.trained or self.after
        change = f"val/ne {b['val/ne']:.4f} -> {t['val/ne']:.4f}, test/ne {b['test/ne']:.4f} -> {t['test/ne']:.4f}"
        if self.kept_start:
            return f"fine-tuning did not improve validation NE ({change}): the run keeps the starting weights"
        return f"fine-tuning improved validation NE ({change}): the run keeps the fine-tuned weights"


def _start(from_scratch: bool, from_supernet: bool) -> str:
    return "scratch" if from_scratch else "supernet" if from_supernet else "own weights"


def check_same_features(trained: FeatureSpec, data: FeatureSpec, where: str) -> None:
    """Weights fit other data only when its sparse features (names, vocabularies, sides) and
    dense count are the ones the model was trained on."""
    if [(f.name, f.vocab_size, f.side) for f in trained.sparse] != [(f.name, f.vocab_size, f.side) for f in data.sparse]:
        raise UserError(f"{where}: the data's sparse features differ from the ones the model was trained on")
    if trained.n_dense != data.n_dense:
        raise UserError(f"{where}: the data has {data.n_dense} dense features, the model was trained on {trained.n_dense}")


def supernet_weights(tracker: Any, run_id: str, arch: Architecture, dst: str | Path) -> dict[str, torch.Tensor]:
    """``arch``'s weights cut from the supernet its search trained (a one-shot or DNAS search)."""
    from rankitect.supernet.train import SUPERNET_DIR, load_supernet

    run = tracker.client.get_run(run_id)
    parent = run.data.tags.get("mlflow.parentRunId") if run.data.tags.get("rankitect.kind") != "search" else run_id
    query = f"tags.`mlflow.parentRunId` = '{parent}' and tags.`rankitect.kind` = 'supernet'"
    found = tracker.client.search_runs([tracker.experiment_id], query) if parent else []
    if not found:
        raise UserError(f"finetune {run_id} --from-supernet: its search kept no supernet (only oneshot and dnas do)")
    folder = tracker.client.download_artifacts(found[0].info.run_id, SUPERNET_DIR, str(dst))
    return load_supernet(folder).extract(arch).state_dict()


def finetune(
    tracker: Any, run_id: str, data: Any, cfg: TrainConfig, *, from_scratch: bool = False,
    from_supernet: bool = False, runtime: RuntimeConfig | None = None, params: dict[str, str] | None = None,
) -> FinetuneOutcome:
    """Continue training the model of ``run_id`` (a candidate, baseline or search run) on ``data``.

    The model starts from the run's weights, from the weights cut out of its search's supernet
    (``from_supernet``), or fresh (``from_scratch``); it is scored on the test
    split before and after, and is logged as a run nested under the run it came from (tagged
    with it too), with its weights attached. If training did not lower the validation NE of the
    starting weights (from the run or the supernet), those are kept. ``runtime`` may compile
    training (see :mod:`rankitect.train.runtime`); ``params`` go to the new run (its data settings).
    """
    from rankitect.search.base import TrialResult
    from rankitect.space import build_model
    from rankitect.space.flops import cost
    from rankitect.train.loop import score

    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(run_id, tmp)
        arch = Architecture.from_json(files.genotype.read_text())
        check_same_features(FeatureSpec.load(files.spec), data.spec, f"finetune {run_id}")
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            model = build_model(arch, data.spec)
            if from_supernet:
                model.load_state_dict(supernet_weights(tracker, files.run_id, arch, Path(tmp) / "supernet"))
            elif not from_scratch:
                model.load_state_dict(read_state_dict(files.weights))  # unreadable: a one-line DataError
            before = score(model, data, cfg)
            start = {k: v.detach().clone() for k, v in model.state_dict().items()}
            out = _train(model, data, cfg, runtime, before, from_scratch)
        kept_start = not from_scratch and out.metrics["val/ne"] >= before["val/ne"]
        if kept_start:
            model.load_state_dict(start)
        after = before if kept_start else out.metrics
        c = cost(arch, data.spec)
        result = TrialResult.from_metrics(after, mflops=c.mflops, params=c.params, train_seconds=out.train_seconds)
        tags = {FROM_TAG: files.run_id, "rankitect.command": "finetune", "rankitect.kind": "finetune",
                "rankitect.start": _start(from_scratch, from_supernet),
                "rankitect.kept": "start" if kept_start else "finetuned"}
        new_id = tracker.log_trial(files.run_id, arch, result, tags, params=params, history=out.history)
        weights = save_weights(model.state_dict(), Path(tmp) / "finetuned.safetensors")
        spec_file = Path(tmp) / "spec.json"
        data.spec.save(spec_file)
        tracker.log_model_files(new_id, weights, spec_file)
    return FinetuneOutcome(new_id, files.run_id, before, after, kept_start, out.metrics)


def _train(model: Any, data: Any, cfg: TrainConfig, runtime: RuntimeConfig | None, before: dict[str, float],
           from_scratch: bool) -> Any:
    """Train ``model`` by the search's protocol; fine-tuning that diverges (validation NE never back
    below 1) leaves a result scored like the start, so the starting weights are kept."""
    from rankitect.train.loop import TrainResult, train_model
    from rankitect.train.task import TrialDiverged

    try:
        return train_model(model, data, cfg, runtime=runtime)
    except TrialDiverged:
        if from_scratch:
            raise
        return TrainResult(model=model, metrics=dict(before), train_seconds=0.0, steps=0, history=[])
