"""The thin LightningModule that owns loss, optimizers, metrics and the divergence guard.

The model is a plain ``nn.Module`` mapping a :class:`~rankitect.data.batch.Batch` to logits; it
never owns training (torchrec's ``DLRMTrain`` pattern).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from rankitect.config import TrainConfig
from rankitect.data.batch import Batch
from rankitect.space.recipe import Recipe
from rankitect.train.optim import RowWiseAdagrad


class TrialDiverged(RuntimeError):
    """Training produced a NaN/inf loss or validation NE, or validation NE above
    :data:`~rankitect.train.protocol.DIVERGED_NE` after its grace (``train.grace_steps``)."""


class TrialPruned(RuntimeError):
    """A search stopped the training early (successive halving): the model is not worth finishing.

    Args:
        message: why, for the log.
        history: the validation metrics so far (the partial curve).
        best_ne: the best validation NE so far.
        steps: training steps taken.
    """

    def __init__(self, message: str, *, history: list[dict[str, float]] | None = None,
                 best_ne: float | None = None, steps: int = 0) -> None:
        super().__init__(message)
        self.history, self.best_ne, self.steps = list(history or []), best_ne, steps


def split_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(sparse, dense): embedding-table parameters, then everything else."""
    sparse_ids: set[int] = set()
    sparse: list[nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, (EmbeddingBagCollection, nn.EmbeddingBag, nn.Embedding)):
            for p in module.parameters():
                if id(p) not in sparse_ids:
                    sparse_ids.add(id(p))
                    sparse.append(p)
    dense = [p for p in model.parameters() if id(p) not in sparse_ids]
    return sparse, dense


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside training wrappers (a compiled model's ``model``, DDP's or DMP's ``module``)."""
    for _ in range(4):
        wrapped = getattr(model, "model", None) or getattr(model, "module", None)
        inner = getattr(model, "arch", None) is None and wrapped
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def recipe_of(model: nn.Module) -> Recipe:
    """The recipe of the architecture ``model`` was built from (today's values for any other module)."""
    recipe = getattr(getattr(unwrap(model), "arch", None), "recipe", None)
    return recipe if isinstance(recipe, Recipe) else Recipe()


def recipe_lrs(cfg: TrainConfig, recipe: Recipe) -> tuple[float, float]:
    """(dense, sparse) learning rates: the configured ones times the genotype's multipliers."""
    return cfg.lr_dense * recipe.lr_dense, cfg.lr_sparse * recipe.lr_sparse


class RankingTask(pl.LightningModule):
    """Binary cross-entropy training of a ranking model with two optimizers.

    Embedding tables use row-wise Adagrad (torchrec), the rest Adam, at the configured learning
    rates times the genotype's recipe multipliers. With the recipe's ``embedding_l2`` the loss adds
    ``embedding_l2 * mean_b sum_f ||e_bf||^2`` over the embedding rows the batch looked up (the
    gradient reaches those rows only). A NaN or infinite loss raises :class:`TrialDiverged`;
    validation, early stopping and the best state belong to the protocol
    (:class:`rankitect.train.protocol.Protocol`).

    Args:
        model: maps a Batch to logits ``(B,)``.
        cfg: learning rates and weight decay.
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig) -> None:
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.recipe = recipe_of(model)
        self.automatic_optimization = False  # two optimizers of different kinds, stepped together
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model(batch)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        sparse, dense = split_parameters(self.model)
        lr_dense, lr_sparse = recipe_lrs(self.cfg, self.recipe)
        opts: list[torch.optim.Optimizer] = []
        if sparse:
            opts.append(RowWiseAdagrad(sparse, lr=lr_sparse))
        if dense:
            opts.append(torch.optim.Adam(dense, lr=lr_dense, weight_decay=self.cfg.weight_decay))
        return opts

    def loss(self, batch: Batch) -> torch.Tensor:
        """The training loss of ``batch``: cross-entropy, plus the embedding L2 term when the recipe has one."""
        l2 = self.recipe.embedding_l2
        inner = unwrap(self.model)
        if not l2 or getattr(inner, "embedding", None) is None:
            return self.loss_fn(self.model(batch).float(), batch.labels)  # fp32 loss under bf16 autocast
        if inner is self.model:
            logits, penalty = inner.forward_with_l2(batch)  # one lookup for both
        else:  # a wrapper runs its own forward; the rows are looked up once more for the penalty
            logits, penalty = self.model(batch), inner.embedding.lookup(batch.sparse).pow(2).sum(dim=1).mean()
        return self.loss_fn(logits.float(), batch.labels) + l2 * penalty.float()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        loss = self.loss(batch)
        if not torch.isfinite(loss):
            raise TrialDiverged(f"training loss is {loss.item()} at step {self.global_step}")
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        # Lightning counts every wrapped optimizer.step() as a global step; step all but the last
        # through the raw optimizer so that one batch is one step (max_steps, val_check_interval).
        for opt in opts[:-1]:
            opt.optimizer.step()
        opts[-1].step()
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=len(batch))
        return loss.detach()

    def transfer_batch_to_device(self, batch: Batch, device: torch.device, dataloader_idx: int) -> Batch:
        return batch.to(device)
