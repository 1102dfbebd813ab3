"""The benches' plain PyTorch reference: a model built as rankitect builds it, the same optimizers
(row-wise Adagrad on embedding tables, Adam on the rest) and a bare training step; no Lightning,
no tracking. Imported by the benches that time a bare loop against the protocol."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rankitect.space import build_model
from rankitect.train.optim import RowWiseAdagrad
from rankitect.train.task import split_parameters


def plain_model(arch: Any, data: Any, cfg: Any) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
    """``arch`` built with seed ``cfg.seed`` (PyTorch's default initialization) and its optimizers."""
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = build_model(arch, data.spec)
    sparse, dense = split_parameters(model)
    return model, [RowWiseAdagrad(sparse, lr=cfg.lr_sparse), torch.optim.Adam(dense, lr=cfg.lr_dense)]


_LOSS = nn.BCEWithLogitsLoss()


def plain_step(model: nn.Module, opts: list[torch.optim.Optimizer], batch: Any) -> None:
    """One training step on ``batch``: BCE on the logits, backward, every optimizer steps."""
    loss = _LOSS(model(batch), batch.labels)
    for o in opts:
        o.zero_grad(set_to_none=True)
    loss.backward()
    for o in opts:
        o.step()
