"""Sharded embeddings: two CPU ranks (gloo) against the single-process run of the same loop.

Tolerance of the loss curves: 1e-4 absolute per step. Both runs see the same global batches and
start from the same weights, so step 0 agrees to float32 rounding; afterwards the only differences
are summation orders (DDP averages two half-batch gradients, the sharded tables sum the ranks'
gradients inside fbgemm's fused rowwise Adagrad instead of torchrec's Python one), i.e. a few ulp
per step that Adam's normalized updates carry forward. Measured: at most 2e-6 over 8 steps. 1e-4
leaves room for other CPUs and thread counts, and still catches real faults: the sharded tables
initialized afresh instead of copied gave 3e-4 at step 0, their outputs left in shard order 3e-4.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rankitect.config import TrainConfig
from rankitect.data.store import ClickData
from rankitect.data.synthetic import generate_synthetic
from rankitect.space import get_baseline
from rankitect.space.testing import tiny_batch, tiny_spec
from rankitect.train.loop import score
from rankitect.train.sharding import (
    init_distributed,
    pad_rows,
    rank_slice,
    shutdown,
    torchrun_ranks,
    train_distributed,
    train_reference,
)

CFG = TrainConfig(steps=6, batch_size=32, val_batches=2, test_batches=2, seed=5, progress=False)
LOSS_TOL = 1e-4
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shard") / "syn"
    generate_synthetic(path, rows=1500, seed=0)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, data_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    env = init_distributed("cpu")
    try:
        data = ClickData.open(data_dir)
        result = train_distributed(get_baseline("dlrm", data.spec, embedding_dim=8), data, CFG, env)
        if env.is_main:
            Path(out).write_text(json.dumps({"losses": result.losses, "metrics": result.metrics, "plan": result.plan}))
    finally:
        shutdown(env)


def _spawn(world: int, *args: str) -> None:
    ctx = mp.start_processes(_worker, args=(world, _free_port(), *args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} ranks did not finish in {TIMEOUT_S} s")


def test_two_ranks_follow_the_single_process_loss_curve(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rank0.json"
    _spawn(2, str(data_dir), str(out))
    sharded = json.loads(out.read_text())
    assert "table_wise" in sharded["plan"] and "rank:1" in sharded["plan"]  # tables really on both ranks

    data = ClickData.open(data_dir)
    ref = train_reference(get_baseline("dlrm", data.spec, embedding_dim=8), data, CFG)
    assert len(sharded["losses"]) == len(ref.losses) == CFG.steps
    diffs = [abs(a - b) for a, b in zip(sharded["losses"], ref.losses)]
    assert max(diffs) <= LOSS_TOL, diffs
    assert ref.losses[-1] < ref.losses[0]  # it trains at all
    # Gathered evaluation (padding and all) scores like the unsharded model on the same rows.
    ref_metrics = score(ref.model, data, CFG)
    for key in ("val/ne", "test/ne", "test/auc"):
        assert sharded["metrics"][key] == pytest.approx(ref_metrics[key], abs=1e-3)


def test_rankitect_train_under_torchrun(data_dir: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
        "-m", "rankitect", "train", "--arch", "baseline:dlrm", "runtime.sharding=torchrec", f"data.source={data_dir}",
        "train.steps=2", "train.batch_size=32", "train.val_batches=1", "train.test_batches=1",
        "train.progress=false", f"track.uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 2 rank(s)" in proc.stdout and "test/ne" in proc.stdout and "MLflow run:" in proc.stdout


def test_rank_slices_cover_the_batch_in_order() -> None:
    batch = tiny_batch(tiny_spec(), 7)
    padded = pad_rows(batch, 2)
    assert len(padded) == 8 and torch.equal(padded.sparse_ids()[7], batch.sparse_ids()[6])
    halves = [rank_slice(padded, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([h.sparse_ids() for h in halves]), padded.sparse_ids())
    assert torch.equal(torch.cat([h.dense for h in halves]), padded.dense)
    with pytest.raises(ValueError, match="world_size=2"):
        rank_slice(batch, 0, 2)


def test_torchrun_is_detected_from_the_environment() -> None:
    assert torchrun_ranks({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4, 3)
    assert torchrun_ranks({"WORLD_SIZE": "4"}) is None
