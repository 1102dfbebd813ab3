"""A tiny click data set on the tiny feature spec for the runtime and FP8 tests (no generator
warm-up: the synthetic generator's calibration alone takes seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankitect.data.store import ClickData, StoreWriter
from rankitect.space.testing import tiny_spec


def tiny_data(out: Path, rows: int = 512, seed: int = 0) -> ClickData:
    """``rows`` rows per split, requests of 4 rows; labels from a logistic model of the dense
    features and the first sparse feature, so training has something to learn."""
    spec = tiny_spec()
    rng = np.random.default_rng(seed)
    w_dense, w_ids = rng.normal(0, 0.6, spec.n_dense), rng.normal(0, 0.8, spec.sparse[0].vocab_size)
    with StoreWriter(out, spec, {"train": rows, "val": rows, "test": rows}) as writer:
        for split in ("train", "val", "test"):
            dense = rng.standard_normal((rows, spec.n_dense)).astype(np.float32)
            ids = np.stack([rng.integers(0, f.vocab_size, rows) for f in spec.sparse], axis=1)
            probs = 1 / (1 + np.exp(1.0 - dense @ w_dense - w_ids[ids[:, 0]]))
            labels = (rng.random(rows) < probs).astype(np.float32)
            writer.write(split, dense, ids, labels, np.arange(rows) // 4)
        return writer.close({"source": "tiny-test"})
