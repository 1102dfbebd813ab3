"""Sharded embeddings: ``rankitect train`` on two CPU ranks (torchrun, gloo) against the
single-process run of the same loop (:func:`~rankitect.train.sharding.train_reference`).

Tolerance of the loss curves: 1e-5 absolute per step over 12 steps. Both runs see the same
global batches and start from the same weights; what differs is summation order (DDP averages two
half-batch gradients, torchrec's all-to-all divides the tables' gradients by the world size, fbgemm's
fused rowwise Adagrad replaces torchrec's Python one), i.e. float32 rounding: measured at most
1.2e-7 here (6e-8 over 20 steps with another seed and batch size). 1e-5 leaves a wide margin, and
the faults met while building this lie far above it: tables initialized afresh instead of copied,
or their outputs left in shard order, moved the very first loss by 3e-4 to 4e-4.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from rankitect.config import TrainConfig
from rankitect.data.store import ClickData
from rankitect.data.synthetic import generate_synthetic
from rankitect.space import get_baseline
from rankitect.space.testing import tiny_batch, tiny_spec
from rankitect.train.loop import score
from rankitect.train.sharding import pad_rows, rank_slice, torchrun_ranks, train_reference

CFG = TrainConfig(steps=12, batch_size=32, val_batches=2, test_batches=2, seed=5, progress=False)
LOSS_TOL = 1e-5
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


@pytest.mark.slow
def test_rankitect_train_on_two_ranks_follows_the_single_process_loss_curve(data_dir: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
        "-m", "rankitect", "train", "--arch", "baseline:dlrm", "runtime.sharding=torchrec", f"data.source={data_dir}",
        f"train.steps={CFG.steps}", f"train.batch_size={CFG.batch_size}", f"train.seed={CFG.seed}",
        f"train.val_batches={CFG.val_batches}", f"train.test_batches={CFG.test_batches}", "train.progress=false",
        f"track.uri={uri}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 2 rank(s)" in proc.stdout
    assert "table_wise" in proc.stdout and "rank:1" in proc.stdout  # tables really on both ranks
    run_id = re.search(r"MLflow run: (\w+)", proc.stdout).group(1)
    client = MlflowClient(tracking_uri=uri)
    history = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
    sharded = [m.value for m in history]

    data = ClickData.open(data_dir)
    ref = train_reference(get_baseline("dlrm", data.spec), data, CFG)
    assert len(sharded) == len(ref.losses) == CFG.steps
    diffs = [abs(a - b) for a, b in zip(sharded, ref.losses)]
    assert max(diffs) <= LOSS_TOL, diffs
    assert ref.losses[-1] < ref.losses[0]  # it trains at all
    # The gathered evaluation (padding and all) scores like the unsharded model on the same rows.
    logged, expected = client.get_run(run_id).data.metrics, score(ref.model, data, CFG)
    for key in ("val/ne", "test/ne", "test/auc"):
        assert logged[key] == pytest.approx(expected[key], abs=1e-3)


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
