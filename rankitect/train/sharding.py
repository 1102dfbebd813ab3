"""Sharded embedding tables: torchrec ``DistributedModelParallel`` under ``torchrun``.

``torchrun --nproc-per-node 2 -m rankitect train --arch baseline:dlrm runtime.sharding=torchrec``
starts one process per rank. Each builds the same model from ``train.seed``, lets the torchrec
planner shard the embedding tables across the ranks, and DMP's data-parallel wrapper puts the rest
of the model in DDP (gloo on CPU, nccl on GPU). Every global batch of ``train.batch_size`` rows is
cut into ``world_size`` contiguous slices, one per rank. Without torchrun the same path runs as a
one-process group (every table on rank 0), so ``runtime.sharding=torchrec`` never needs a launcher.

What the CPU build of torchrec 1.8 offers (``EmbeddingBagCollectionSharder``): table-wise,
column-wise and table-column-wise with the ``fused`` kernel (fbgemm's CPU table-batched embedding,
the optimizer fused into its backward), data-parallel with the ``dense`` kernel; row-wise and
table-row-wise are CUDA only. Rowwise Adagrad keeps one accumulator per row, so a column split
would change the optimizer; the planner therefore chooses among the layouts that keep whole rows:
table-wise on CPU, table-wise / row-wise / table-row-wise on GPU, always with the fused kernel and
fbgemm's ``EXACT_ROWWISE_ADAGRAD`` (the same update as torchrec's ``RowWiseAdagrad`` used by
:class:`~rankitect.train.task.RankingTask`).

Why the loss curve equals the single-process one (:func:`train_reference`): DDP averages the dense
gradients of the ranks' local mean losses over equal slices, which is the gradient of the global
mean loss. The sharded tables get the same: torchrec's all-to-all divides the gradients it sends
back by the world size (``torchrec.distributed.comm_ops`` gradient division, on by default), so
the fused rowwise Adagrad, ``w -= lr g / (sqrt(sum mean(g^2)) + eps)``, sees the global-mean
gradient and runs with RankingTask's ``eps`` (which is not negligible: with ``eps`` doubled, a
small DLRM's loss drifted from the single-process one by 4e-4 within 20 steps). What remains is
float32 rounding, measured in the tests.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rankitect.config import TrainConfig
from rankitect.data.batch import Batch, batch_history, make_batch
from rankitect.errors import ConfigError
from rankitect.eval.metrics import MetricAccumulator
from rankitect.space.architecture import Architecture
from rankitect.space.builder import RankingModel, build_model
from rankitect.train.task import TrialDiverged, recipe_lrs, split_parameters

SPARSE_EPS = 1e-10  # torchrec RowWiseAdagrad's default eps, the one RankingTask uses
WHOLE_ROW_SHARDINGS = {"cpu": ("table_wise",), "cuda": ("table_wise", "row_wise", "table_row_wise")}


@dataclass(frozen=True)
class DistEnv:
    """One process of a (possibly one-process) group: its rank, the group size and its device."""

    rank: int
    world_size: int
    device: torch.device
    launched: bool  # started by torchrun (else a one-process group made here)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class DistributedResult:
    """What a distributed training gives back: per-step global losses, metrics, the plan."""

    model: nn.Module
    losses: list[float]
    metrics: dict[str, float]
    train_seconds: float
    steps: int
    plan: str = ""


def torchrun_ranks(environ: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when torchrun set ``RANK`` and ``WORLD_SIZE``, else ``None``.

    >>> torchrun_ranks({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}), torchrun_ranks({})
    ((1, 2, 1), None)
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    return rank, world, int(env.get("LOCAL_RANK", rank))


def init_distributed(device: str = "cpu") -> DistEnv:
    """Join the torchrun group (``env://``), or make a one-process group when not under torchrun.

    The backend is gloo on CPU and nccl on CUDA. An already initialized group is reused.
    """
    ranks = torchrun_ranks()
    kind = torch.device(device).type
    if kind not in WHOLE_ROW_SHARDINGS:
        raise ConfigError(f"runtime.device={device!r}: sharded training runs on 'cpu' or 'cuda'")
    local = ranks[2] if ranks is not None else 0
    dev = torch.device("cuda", local) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "nccl" if kind == "cuda" else "gloo"
        if ranks is not None:
            dist.init_process_group(backend, init_method="env://")
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistEnv(dist.get_rank(), dist.get_world_size(), dev, launched=ranks is not None)


def shutdown(env: DistEnv) -> None:
    """Leave the process group (after a barrier, so no rank tears it down under another)."""
    if dist.is_initialized():
        if env.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()


def open_data_in_turn(env: DistEnv, source: str, options: Any) -> Any:
    """Open the data on rank 0 first (it may build the cache), then on the others."""
    from rankitect.data import open_data

    data = open_data(source, options, progress=env.is_main) if env.is_main else None
    if env.world_size > 1:
        dist.barrier()
    return data if data is not None else open_data(source, options)


def shard_model(model: RankingModel, env: DistEnv, cfg: TrainConfig) -> tuple[nn.Module, str]:
    """Wrap ``model`` in ``DistributedModelParallel``: tables sharded by the planner, the rest in DDP.

    Returns the wrapped model and the plan as text. The tables train with fbgemm's fused rowwise
    Adagrad (learning rate ``cfg.lr_sparse``, RankingTask's ``eps``) and start from ``model``'s own
    table weights.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    if model.embedding is None:
        raise ValueError("sharding needs an architecture that reads 'sparse'; this one has no embedding tables")
    if model.history is not None:  # a history reads its table row by row, which a sharded collection does not give
        raise ValueError("sharding: an architecture that reads a history (a history block) is not sharded yet")
    fused = {
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        "learning_rate": cfg.lr_sparse,
        "eps": SPARSE_EPS,
    }
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    plan = _planner(model, env).collective_plan(model, [sharder], dist.group.WORLD)
    full = {k: v.detach().clone() for k, v in model.embedding.state_dict(prefix="embedding.").items()}
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=env.device, plan=plan, sharders=[sharder]
    )
    _copy_into_shards(dmp, full)
    return dmp, str(plan)


def _planner(model: RankingModel, env: DistEnv) -> Any:
    """torchrec's planner, restricted to whole-row layouts with the fused kernel (module docstring)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, ParameterConstraints, TopologyFactory, TrainerConfig

    kinds = list(WHOLE_ROW_SHARDINGS[env.device.type])
    constraints = {
        table.name: ParameterConstraints(sharding_types=kinds, compute_kernels=["fused"])
        for table in model.embedding.ebc.embedding_bag_configs()
    }
    local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=env.world_size, local_world_size=local),
        kernel_config=KernelConfig(compute_device=env.device.type),
    )
    return EmbeddingShardingPlanner(
        topology=topology, storage_reservation=FixedPercentageStorageReservation(0.15), constraints=constraints
    )


@torch.no_grad()
def _copy_into_shards(dmp: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Load the built tables into this rank's shards (the sharder initializes them afresh)."""
    for key, value in dmp.state_dict().items():
        if key not in full or not hasattr(value, "local_shards"):
            continue
        for shard in value.local_shards():
            (r, c), (n, d) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[key][r : r + n, c : c + d])  # the shard is a view into the kernel's weights


def take_rows(batch: Batch, rows: slice | torch.Tensor) -> Batch:
    """The rows ``rows`` of ``batch`` as a new batch (sparse ids rebuilt as a one-id-per-row KJT)."""
    probs = None if batch.probs is None else batch.probs[rows]
    return make_batch(
        batch.dense[rows], batch.sparse_ids()[rows], batch.labels[rows], batch.request_ids[rows],
        keys=list(batch.sparse.keys()), probs=probs, history=batch_history(batch, rows) or None,
    )


def rank_slice(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s contiguous share of a global batch whose size ``world_size`` divides.

    >>> from rankitect.space.testing import tiny_batch, tiny_spec
    >>> rank_slice(tiny_batch(tiny_spec(), 6), 1, 2).request_ids.tolist()
    [1, 2, 2]
    """
    B = len(batch)
    if B % world_size:
        raise ValueError(f"a batch of {B} rows does not split evenly over world_size={world_size}")
    n = B // world_size
    return take_rows(batch, slice(rank * n, (rank + 1) * n))


def pad_rows(batch: Batch, multiple: int) -> Batch:
    """``batch`` with its last row repeated until its size is a multiple of ``multiple``."""
    extra = -len(batch) % multiple
    if extra == 0:
        return batch
    rows = torch.cat([torch.arange(len(batch)), torch.full((extra,), len(batch) - 1)])
    return take_rows(batch, rows)


def global_batches(split: Any, batch_size: int, seed: int) -> Iterator[Batch]:
    """Full training batches forever: epoch ``e`` shuffles requests with ``seed + e`` (drop_last)."""
    for epoch in itertools.count():
        n = 0
        for batch in split.batches(batch_size, shuffle=True, seed=seed + epoch, drop_last=True):
            n += 1
            yield batch
        if n == 0:
            raise ValueError(f"the train split has {len(split)} rows, fewer than one batch of {batch_size}")


def _mean_over_ranks(value: torch.Tensor, env: DistEnv | None) -> float:
    if env is None or env.world_size == 1:
        return float(value)
    total = value.detach().clone().reshape(1)
    dist.all_reduce(total)  # SUM over ranks; equal slices, so the mean of means is the global mean
    return float(total) / env.world_size


def train_loop(
    model: nn.Module, optimizers: list[torch.optim.Optimizer], batches: Iterator[Batch], steps: int,
    env: DistEnv | None = None,
) -> list[float]:
    """``steps`` steps of RankingTask's loss (BCE on logits); returns the global loss of each step.

    With ``env`` each rank trains on its slice of every global batch. A non-finite loss raises
    :class:`~rankitect.train.task.TrialDiverged` on every rank before any update.
    """
    loss_fn = nn.BCEWithLogitsLoss()
    losses: list[float] = []
    model.train()
    for step in range(steps):
        batch = next(batches)
        if env is not None:
            batch = rank_slice(batch, env.rank, env.world_size).to(env.device)
        loss = loss_fn(model(batch), batch.labels)
        value = _mean_over_ranks(loss.detach(), env)
        if not math.isfinite(value):
            raise TrialDiverged(f"training loss is {value} at step {step}")
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in optimizers:
            opt.step()
        losses.append(value)
    return losses


@torch.no_grad()
def evaluate_distributed(model: nn.Module, batches: Iterator[Batch], env: DistEnv, max_batches: int = 0) -> dict[str, float]:
    """Metrics over ``batches``: each rank scores its slice, logits are gathered on every rank.

    A batch is padded to a multiple of the world size (its last row repeated) and the padding
    dropped after the gather, so every row counts once.
    """
    model.eval()
    acc = MetricAccumulator()
    try:
        for batch in itertools.islice(batches, max_batches) if max_batches > 0 else batches:
            local = rank_slice(pad_rows(batch, env.world_size), env.rank, env.world_size).to(env.device)
            logits = model(local).float()
            parts = [torch.empty_like(logits) for _ in range(env.world_size)]
            dist.all_gather(parts, logits)
            acc.update(torch.cat(parts)[: len(batch)].cpu(), batch.labels)
    finally:
        model.train()
    return {k: float(v) for k, v in acc.compute().items()}


def build_seeded(arch: Architecture, spec: Any, seed: int) -> RankingModel:
    """``build_model(arch, spec)`` under ``torch.manual_seed(seed)``, the caller's RNG untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build_model(arch, spec)


def _with_recipe_lrs(cfg: TrainConfig, arch: Architecture) -> TrainConfig:
    """``cfg`` with the genotype's learning rates (the recipe's multipliers applied once, here)."""
    lr_dense, lr_sparse = recipe_lrs(cfg, arch.recipe)
    return replace(cfg, lr_dense=lr_dense, lr_sparse=lr_sparse)


def train_distributed(
    arch: Architecture, data: Any, cfg: TrainConfig, env: DistEnv, *, steps: int | None = None
) -> DistributedResult:
    """Train ``arch`` with sharded tables on this rank of ``env``, then score val and test.

    ``cfg.batch_size`` is the global batch; ``env.world_size`` must divide it.
    """
    steps = cfg.steps if steps is None else steps
    cfg = _with_recipe_lrs(cfg, arch)
    if not arch.uses("sparse"):
        raise ConfigError(f"runtime.sharding=torchrec: architecture {arch.hash} reads no sparse features (no tables)")
    if cfg.batch_size % env.world_size:
        raise ConfigError(f"train.batch_size={cfg.batch_size} is not divisible by the world size {env.world_size}")
    dmp, plan = shard_model(build_seeded(arch, data.spec, cfg.seed), env, cfg)
    dense = list(dmp.module.dense_parameters())
    optimizers = [torch.optim.Adam(dense, lr=cfg.lr_dense, weight_decay=cfg.weight_decay)]
    start = time.perf_counter()
    losses = train_loop(dmp, optimizers, global_batches(data.split("train"), cfg.batch_size, cfg.seed), steps, env)
    seconds = time.perf_counter() - start
    metrics: dict[str, float] = {}
    for split, limit in (("val", cfg.val_batches), ("test", cfg.test_batches)):
        batches = data.split(split).batches(cfg.batch_size, shuffle=False, seed=0)
        metrics.update({f"{split}/{k}": v for k, v in evaluate_distributed(dmp, batches, env, limit).items()})
    return DistributedResult(dmp, losses, metrics, seconds, steps, plan)


def train_reference(arch: Architecture, data: Any, cfg: TrainConfig, *, steps: int | None = None) -> DistributedResult:
    """The single-process run :func:`train_distributed` must match: same batches, seed, optimizers.

    RankingTask's optimizers (row-wise Adagrad on the tables, Adam on the rest) in the
    plain loop; no metrics (``metrics`` is empty).
    """
    steps = cfg.steps if steps is None else steps
    cfg = _with_recipe_lrs(cfg, arch)
    model = build_seeded(arch, data.spec, cfg.seed)
    from rankitect.train.optim import RowWiseAdagrad

    sparse, dense = split_parameters(model)
    optimizers: list[torch.optim.Optimizer] = [RowWiseAdagrad(sparse, lr=cfg.lr_sparse, eps=SPARSE_EPS)]
    optimizers.append(torch.optim.Adam(dense, lr=cfg.lr_dense, weight_decay=cfg.weight_decay))
    start = time.perf_counter()
    losses = train_loop(model, optimizers, global_batches(data.split("train"), cfg.batch_size, cfg.seed), steps)
    return DistributedResult(model, losses, {}, time.perf_counter() - start, steps)


__all__ = [
    "DistEnv",
    "DistributedResult",
    "evaluate_distributed",
    "global_batches",
    "init_distributed",
    "open_data_in_turn",
    "rank_slice",
    "shard_model",
    "shutdown",
    "torchrun_ranks",
    "train_distributed",
    "train_loop",
    "train_reference",
]
