"""Runtime options of training: ``torch.compile`` with Inductor's group/batch fusion, and FP8.

``runtime.compile=true`` trains under ``torch.compile`` (Inductor) with the Optimus pre-grad
batch-fusion passes on (``runtime.compile_fusion``): parallel linears, LayerNorms and pointwise
ops that read independent inputs are stacked into one batched op. Only the dense part is compiled
(``RankingModel.forward_dense``, everything after the lookup); the torchrec embedding lookup stays
eager. torchrec's ``EmbeddingBagCollection`` and ``KeyedJaggedTensor`` do trace here (one graph,
no break), but compiling them made no step faster and cost 3x the compile time (DCNv2, cold
cache: 30 s whole model, 9 s dense part), and a sharded collection would not trace at all.

Only the training forward is compiled, for one batch shape (``dynamic=False``): validation, no-grad
calls and a batch of another size (the short last batch of an epoch) run eager, so a run compiles
exactly once. A compile failure (at the warm-up step or later) falls back to eager with one
warning; the trial goes on.

Where it pays (``bench/speed/runtime_bench.py``: 2 shared CPU cores, 1 thread, batch 512, cold
Inductor caches). DCNv2: compile 24-38 s, warm step 154-157 ms against 162 ms eager (1.03-1.06x),
break-even after 2,700-7,600 steps (a quieter run of the whole model gave 0.89x). A 10-MFLOPs
``nasrec`` sample: compile 175-242 s and steps 0.84x as fast: never. The Optimus passes fire on none
of the six baselines nor of six sampled candidates at torch's threshold (5 parallel same-shape
ops); they are meant for models with many parallel towers. So: off for search trials of a few
hundred steps (``rankitect search`` says so and runs them eager), worth trying for long
``rankitect train`` / ``finetune`` runs of DCN-like models and on GPUs (not measured here). Not
for the one-shot supernet while it samples paths: ``Supernet.forward(batch, path)`` plans each
path in Python, so every new path would be a new graph and another cold compile.

``runtime.precision=fp8`` (CUDA capability >= 8.9) first probes a few training batches
(:func:`rankitect.train.fp8.probe_model`) and converts only the layers below
``runtime.fp8_threshold`` to torchao float8 training.
"""

from __future__ import annotations

import logging
import time
import warnings
from itertools import islice
from typing import Any, Callable

import torch
from torch import nn

from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.train.fp8 import convert_fp8_layers, probe_model, require_fp8_device

log = logging.getLogger(__name__)

# Optimus passes asked for (torch._inductor.fx_passes.group_batch_fusion registers them by name).
PRE_GRAD_FUSIONS = ("batch_linear", "batch_layernorm", "batch_relu", "batch_sigmoid", "batch_tanh")
# group_linear lowers to fbgemm's grouped GEMM (torch.ops.fbgemm.gmm, CUDA): only where torch
# finds fbgemm's Inductor lowerings, which the open-source CPU build does not ship.
POST_GRAD_FUSIONS = ("group_linear",)
PROBE_BATCHES = 4  # training batches the FP8 probe runs before conversion


def fusion_options() -> dict[str, dict[str, dict[str, Any]]]:
    """Inductor options that switch on the Optimus passes this torch has (warns about the rest).

    >>> sorted(fusion_options()["pre_grad_fusion_options"])
    ['batch_layernorm', 'batch_linear', 'batch_relu', 'batch_sigmoid', 'batch_tanh']
    """
    from torch._inductor.fx_passes import group_batch_fusion as gbf

    pre = {name: {} for name in PRE_GRAD_FUSIONS if name in gbf.PRE_GRAD_FUSIONS}
    post = {name: {"require_fbgemm": True} for name in POST_GRAD_FUSIONS if name in gbf.POST_GRAD_FUSIONS}
    missing = sorted(set(PRE_GRAD_FUSIONS) - set(pre)) + sorted(set(POST_GRAD_FUSIONS) - set(post))
    if missing:
        warnings.warn(f"torch {torch.__version__} has no Inductor fusion pass named {missing}; "
                      "compiling without them", stacklevel=2)
    if post and not getattr(gbf, "has_fbgemm", False):
        log.info("group_linear needs fbgemm's Inductor lowerings, absent here: Inductor skips it")
    return {"pre_grad_fusion_options": pre, "post_grad_fusion_options": post}


class CompiledModel(nn.Module):
    """Runs ``model``'s training forward under ``torch.compile``; everything else eager.

    With a ``forward_dense(batch, emb)`` (a RankingModel) only that part is compiled and
    ``model.embedding`` runs eager; other modules are compiled whole. Eager: eval mode, grad
    disabled, a batch whose size differs from the warm-up batch's, and every call after a compile
    failure (warned once). ``model`` keeps its own parameter names: this wrapper adds none and
    holds the compiled function outside the module tree.

    Args:
        model: maps a Batch to logits.
        fusion: switch on the Optimus batch-fusion passes (see :func:`fusion_options`).
        backend: ``torch.compile``'s backend (``"inductor"``; tests pass one that raises).
    """

    def __init__(
        self, model: nn.Module, *, fusion: bool = True, backend: str | Callable[..., Any] = "inductor"
    ) -> None:
        super().__init__()
        self.model = model
        self.failed: str | None = None
        self.batch_size: int | None = None
        options = fusion_options() if fusion and backend == "inductor" else None
        dense = getattr(model, "forward_dense", None)
        self.dense_only = dense is not None and hasattr(model, "embedding")
        target = dense if self.dense_only else model.forward
        self._compiled = torch.compile(target, backend=backend, dynamic=False, options=options)

    def forward(self, batch: Any) -> torch.Tensor:
        if self._use_compiled(batch):
            try:
                return self._run_compiled(batch)
            except Exception as e:  # noqa: BLE001 - any compiler error: train on eagerly
                self._fall_back(e)
        return self.model(batch)

    def _run_compiled(self, batch: Any) -> torch.Tensor:
        if not self.dense_only:
            return self._compiled(batch)
        embedding = self.model.embedding
        return self._compiled(batch, embedding(batch.sparse) if embedding is not None else None)

    def _use_compiled(self, batch: Any) -> bool:
        if self.failed is not None or not self.training or not torch.is_grad_enabled():
            return False
        if self.batch_size is None:
            self.batch_size = len(batch)
        return len(batch) == self.batch_size

    def _fall_back(self, error: BaseException) -> None:
        root = error
        while True:  # Dynamo wraps the backend's own error (BackendCompilerFailed.inner_exception)
            inner = getattr(root, "inner_exception", None) or root.__cause__
            if not isinstance(inner, BaseException):
                break
            root = inner
        lines = str(root).strip().splitlines()
        self.failed = f"{type(root).__name__}: {lines[0] if lines else ''}"[:300]
        warnings.warn(f"torch.compile failed, training eagerly instead ({self.failed})", stacklevel=2)

    def warm_up(self, batch: Any) -> float:
        """Compile forward and backward on ``batch`` now; returns the seconds it took.

        The gradients it leaves are cleared, so the weights are as before.
        """
        was_training = self.training
        self.train()
        start = time.perf_counter()
        try:
            out = self(batch)
            if self.failed is None:
                try:
                    out.float().sum().backward()  # the backward graph compiles on its first use
                except Exception as e:  # noqa: BLE001
                    self._fall_back(e)
        finally:
            for p in self.model.parameters():
                p.grad = None
            self.train(was_training)
        return time.perf_counter() - start


def first_batch(data: Any, cfg: TrainConfig) -> Any:
    """The first training batch in storage order (a warm-up or probe input of training's size)."""
    return next(iter(data.split("train").batches(cfg.batch_size, shuffle=False, seed=0)))


def prepare_training(model: nn.Module, data: Any, cfg: TrainConfig, runtime: RuntimeConfig) -> nn.Module:
    """The module to train for ``runtime``: ``model`` itself, FP8-converted, and/or compiled.

    FP8 converts ``model`` in place (safe layers only); compiling wraps it (:class:`CompiledModel`)
    and compiles at once on the first training batch. Raises UserError when ``runtime.precision``
    is ``fp8`` and no capable GPU is there.
    """
    device = torch.device(runtime.device)
    if runtime.precision == "fp8":
        device = require_fp8_device(runtime.device)
        batches = islice(data.split("train").batches(cfg.batch_size, shuffle=True, seed=cfg.seed), PROBE_BATCHES)
        report = probe_model(model, batches, threshold=runtime.fp8_threshold, scaling=runtime.fp8_scaling)
        converted = convert_fp8_layers(model, report.fp8_layers(), scaling=runtime.fp8_scaling)
        log.info("%s; converted %s", report.summary(), converted)
    if not runtime.compile:
        return model
    # Dynamo caches by code object: RankingModel.forward of every earlier candidate of this process
    # would count against its recompile limit (8), past which it silently runs eager. One trial
    # trains at a time, so start each from empty caches.
    torch._dynamo.reset()
    compiled = CompiledModel(model.to(device), fusion=runtime.compile_fusion)
    seconds = compiled.warm_up(first_batch(data, cfg).to(device))
    log.info("compiled in %.1f s%s", seconds, f" (failed: {compiled.failed})" if compiled.failed else "")
    return compiled


__all__ = ["CompiledModel", "POST_GRAD_FUSIONS", "PRE_GRAD_FUSIONS", "first_batch", "fusion_options",
           "prepare_training"]
