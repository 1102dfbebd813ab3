"""Fine-tune a trained model: more steps on the data it was trained on, kept only if it helped.

Training is :func:`rankitect.train.loop.train_model`, the protocol every trained model follows
(early stopping on validation NE with the best state restored, where the loop has it). The model
is scored before and after; if fine-tuning did not lower the validation NE, the model gets back
the weights it started from, and the outcome says so. ``rankitect finetune RUN``
(:mod:`rankitect.cli.finetune`) reads a tracked run's model and logs the result as a new run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.data.spec import FeatureSpec
from rankitect.errors import UserError
from rankitect.train.loop import TrainResult, score, train_model
from rankitect.train.protocol import StepHook
from rankitect.train.task import TrialDiverged


@dataclass
class FinetuneOutcome:
    before: dict[str, float]  # of the starting weights
    after: dict[str, float]  # of the weights the model keeps
    kept_start: bool = False  # fine-tuning did not lower val/ne: the starting weights were kept
    trained: dict[str, float] | None = None  # of the fine-tuned weights, whether kept or not
    train_seconds: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)  # validation curve of the training

    def verdict(self) -> str:
        """One line: what fine-tuning did to validation and test NE, and which weights were kept."""
        b, t = self.before, self.trained or self.after
        change = f"val/ne {b['val/ne']:.4f} -> {t['val/ne']:.4f}, test/ne {b['test/ne']:.4f} -> {t['test/ne']:.4f}"
        if self.kept_start:
            return f"fine-tuning did not improve validation NE ({change}): the run keeps the starting weights"
        return f"fine-tuning improved validation NE ({change}): the run keeps the fine-tuned weights"


def check_same_features(trained: FeatureSpec, data: FeatureSpec, where: str) -> None:
    """Weights fit other data only when its sparse features (names, vocabularies, sides) and
    dense count are the ones the model was trained on."""
    if [(f.name, f.vocab_size, f.side) for f in trained.sparse] != [(f.name, f.vocab_size, f.side) for f in data.sparse]:
        raise UserError(f"{where}: the data's sparse features differ from the ones the model was trained on")
    if trained.n_dense != data.n_dense:
        raise UserError(f"{where}: the data has {data.n_dense} dense features, the model was trained on {trained.n_dense}")


def finetune_model(
    model: Any, data: Any, cfg: TrainConfig, *, from_scratch: bool = False, runtime: RuntimeConfig | None = None,
    on_step: StepHook | None = None,
) -> FinetuneOutcome:
    """Train ``model`` further on ``data`` by the search's protocol, scoring it before and after.

    ``model`` holds its starting weights (a run's, a supernet's cut, or fresh ones when
    ``from_scratch``). Unless ``from_scratch``, a training that does not lower the validation NE
    of the start gives the model its starting weights back (``kept_start``). ``runtime`` may
    compile training (see :mod:`rankitect.train.runtime`); ``on_step`` sees every training step
    (a progress display).
    """
    before = score(model, data, cfg)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = _train(model, data, cfg, runtime, before, from_scratch, on_step)
    kept_start = not from_scratch and out.metrics["val/ne"] >= before["val/ne"]
    if kept_start:
        model.load_state_dict(start)
    after = before if kept_start else out.metrics
    return FinetuneOutcome(before, after, kept_start, out.metrics, out.train_seconds, out.history)


def _train(model: Any, data: Any, cfg: TrainConfig, runtime: RuntimeConfig | None, before: dict[str, float],
           from_scratch: bool, on_step: StepHook | None = None) -> TrainResult:
    """Train ``model`` by the search's protocol; fine-tuning that diverges (validation NE never back
    below 1) leaves a result scored like the start, so the starting weights are kept."""
    try:
        return train_model(model, data, cfg, runtime=runtime, on_step=on_step)
    except TrialDiverged:
        if from_scratch:
            raise
        return TrainResult(model=model, metrics=dict(before), train_seconds=0.0, steps=0, history=[])
