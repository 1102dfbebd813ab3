"""A tiny click data set on the tiny feature spec, with a planted logistic teacher, for search tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankitect.data.spec import FeatureSpec
from rankitect.data.store import ClickData, StoreWriter
from rankitect.space.testing import tiny_spec


def tiny_click_data(out: Path, rows: int = 1024, seed: int = 0, spec: FeatureSpec | None = None) -> ClickData:
    """``rows`` rows per split: normal dense values, uniform ids, labels from a random logistic model
    with a pairwise term, so that models have something to learn and interactions help."""
    spec = spec or tiny_spec()
    rng = np.random.default_rng(seed)
    w_dense = rng.normal(0, 0.6, spec.n_dense)
    w_ids = [rng.normal(0, 0.8, f.vocab_size) for f in spec.sparse]
    with StoreWriter(out, spec, {"train": rows, "val": rows, "test": rows}, with_probs=True) as writer:
        for split in ("train", "val", "test"):
            dense = rng.standard_normal((rows, spec.n_dense)).astype(np.float32)
            ids = np.stack([rng.integers(0, f.vocab_size, rows) for f in spec.sparse], axis=1)
            first = sum(w[ids[:, j]] for j, w in enumerate(w_ids))
            logit = -1.0 + dense @ w_dense + first + 0.8 * w_ids[0][ids[:, 0]] * w_ids[1][ids[:, 1]]
            probs = 1 / (1 + np.exp(-logit))
            labels = (rng.random(rows) < probs).astype(np.float32)
            writer.write(split, dense, ids, labels, np.arange(rows) // 4, probs.astype(np.float32))
        return writer.close({"source": "tiny-test"})
