"""Data-path throughput: Criteo TSV parsing, batch iteration, and data loading's share of a step.

    python -m bench.speed.data_bench             # 1M rows
    python -m bench.speed.data_bench --rows 200000

1. writes a Criteo-layout TSV of ``--rows`` rows into a temporary directory (not timed), then times
   ``read_criteo`` on it (both passes: counting and parsing) -> rows/second;
2. times iterating the train split in batches of ``--batch-size`` (shuffled by request) -> rows/s;
3. times one batch fetch against one forward + backward + optimizer step of a small
   embedding + MLP model (below), and prints both and the share of the step spent fetching.

Numbers are ratios measured side by side in one run; the machine is shared, so repeat to trust.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from bench.common import parse_args
from rankitect.data import read_criteo
from rankitect.data.batch import Batch


def write_criteo_tsv(path: Path, rows: int, seed: int = 0, chunk: int = 100_000) -> None:
    """Criteo-like rows: Zipf-ish hex categoricals, log-normal counts, ~10% empty fields, CTR ~0.25."""
    rng = np.random.default_rng(seed)
    vocab = [np.array([f"{x:08x}" for x in rng.integers(0, 2**32, v)], dtype=object)
             for v in np.geomspace(10, 200_000, 26).astype(int)]
    with open(path, "w") as f:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            cols: dict[int, np.ndarray] = {0: (rng.random(n) < 0.25).astype(int).astype(str)}
            ints = np.floor(np.exp(rng.normal(1.5, 1.5, (n, 13)))).astype(np.int64) - 1  # -1 occurs
            for j in range(13):
                cols[1 + j] = np.where(rng.random(n) < 0.1, "", ints[:, j].astype(str))
            for j, v in enumerate(vocab):
                ranks = np.minimum(rng.zipf(1.2, n) - 1, len(v) - 1)
                cols[14 + j] = np.where(rng.random(n) < 0.05, "", v[ranks])
            pd.DataFrame(cols).to_csv(f, sep="\t", header=False, index=False)


class TinyRanker(nn.Module):
    """Embeddings (one table, offset per field) concatenated with dense, then an MLP -> logits."""

    def __init__(self, vocab_sizes: list[int], n_dense: int, dim: int = 16) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.tensor(np.r_[0, np.cumsum(vocab_sizes)[:-1]]), persistent=False)
        self.emb = nn.Embedding(int(sum(vocab_sizes)), dim, sparse=True)
        width = len(vocab_sizes) * dim + n_dense
        self.mlp = nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, batch: Batch) -> torch.Tensor:
        e = self.emb(batch.sparse_ids() + self.offsets)  # (B, F) -> (B, F, D)
        x = torch.cat([e.flatten(1), batch.dense], dim=1)  # (B, F * D + n_dense)
        return self.mlp(x).squeeze(1)  # (B, 1) -> (B,)


def bench_parse(tsv: Path, out: Path, vocab_size: int) -> tuple[object, float]:
    t = time.perf_counter()
    data = read_criteo(tsv, out, vocab_size=vocab_size, progress=False)
    return data, time.perf_counter() - t


def bench_iterate(split, batch_size: int, seed: int) -> tuple[float, int]:
    t, n = time.perf_counter(), 0
    for b in split.batches(batch_size, shuffle=True, seed=seed):
        n += len(b)
    return time.perf_counter() - t, n


def bench_step(split, batch_size: int, steps: int) -> tuple[float, float]:
    """Mean seconds per batch fetch and per training step (after 3 warm-up steps)."""
    model = TinyRanker([f.vocab_size for f in split.spec.sparse], split.spec.n_dense)
    opt_sparse = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-3)
    opt_dense = torch.optim.Adam(list(model.mlp.parameters()), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    it = split.batches(batch_size, shuffle=True, seed=1)
    fetch = step = 0.0
    for i in range(steps + 3):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss_fn(model(batch), batch.labels).backward()
        opt_sparse.step()
        opt_dense.step()
        t2 = time.perf_counter()
        if i >= 3:
            fetch, step = fetch + (t1 - t0), step + (t2 - t1)
    return fetch / steps, step / steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--vocab-size", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=30)
    args = parse_args(ap, {"rows": 5000, "batch_size": 256, "vocab_size": 1000, "steps": 5}, argv)
    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "criteo.tsv"
        t = time.perf_counter()
        write_criteo_tsv(tsv, args.rows)
        mb = tsv.stat().st_size / 2**20
        print(f"wrote {args.rows:,} rows ({mb:.0f} MiB) in {time.perf_counter() - t:.1f} s (not part of the bench)")
        data, secs = bench_parse(tsv, Path(tmp) / "cache", args.vocab_size)
        print(f"parse:   {args.rows / secs:,.0f} rows/s  ({secs:.1f} s, {mb / secs:.1f} MiB/s)")
        train = data.split("train")
        for epoch in ("first", "second"):  # the first epoch also maps the freshly written pages
            secs, n = bench_iterate(train, args.batch_size, seed=len(epoch))
            print(f"iterate: {n / secs:,.0f} rows/s  ({epoch} epoch of the train split, {n:,} rows, "
                  f"batch {args.batch_size}, shuffled by request)")
        fetch, step = bench_step(train, args.batch_size, args.steps)
        print(f"step:    fetch {fetch * 1e3:.1f} ms, forward+backward+Adam {step * 1e3:.1f} ms, "
              f"fetch share {fetch / (fetch + step):.1%} of a step (torch threads: {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
