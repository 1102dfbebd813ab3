"""A tiny feature spec and random batches for tests, doctests and benchmarks.

The spec is small on purpose (4 dense + 6 sparse features, vocabularies of 5 to 20 ids, one
request-side feature of each kind) so that building and running a model takes milliseconds.
"""

from __future__ import annotations

import numpy as np

from rankitect.data.batch import Batch, make_batch
from rankitect.data.spec import DenseFeature, FeatureSpec, SequenceFeature, SparseFeature


def tiny_spec(n_dense: int = 4, n_sparse: int = 6, history: int = 0) -> FeatureSpec:
    """``n_dense`` dense and ``n_sparse`` sparse features; the last of each kind is request side.
    ``history > 0`` adds a history ``h0`` of that many ids sharing the candidate feature ``s0``.

    >>> spec = tiny_spec()
    >>> spec.n_dense, spec.n_sparse, spec.n_request_sparse, [f.vocab_size for f in spec.sparse][:3]
    (4, 6, 1, [5, 8, 11])
    >>> tiny_spec(history=3).sequence[0]
    SequenceFeature(name='h0', max_len=3, vocab_size=5, shares='s0', side='request')
    """
    dense = tuple(
        DenseFeature(f"d{i}", side="request" if i == n_dense - 1 else "candidate") for i in range(n_dense)
    )
    sparse = tuple(
        SparseFeature(f"s{i}", 5 + 3 * i, side="request" if i == n_sparse - 1 else "candidate")
        for i in range(n_sparse)
    )
    sequence = (SequenceFeature("h0", history, sparse[0].vocab_size, shares="s0"),) if history else ()
    return FeatureSpec(dense=dense, sparse=sparse, name="tiny", sequence=sequence)


def tiny_batch(spec: FeatureSpec, batch_size: int = 4, seed: int = 0, *, per_request: int = 2) -> Batch:
    """A random batch for ``spec``: normal dense values, uniform ids, random labels.

    Rows come in requests of ``per_request`` candidates that share their request-side features (and
    their histories: of every length from 0 to ``max_len``, ids drawn after everything else).

    >>> b = tiny_batch(tiny_spec(), 4)
    >>> tuple(b.dense.shape), b.request_ids.tolist(), bool((b.sparse_ids()[0] == b.sparse_ids()[1])[-1])
    ((4, 4), [0, 0, 1, 1], True)
    """
    rng = np.random.default_rng(seed)
    request_ids = np.arange(batch_size) // per_request
    first = request_ids * per_request  # each row's first row of its request
    dense = rng.standard_normal((batch_size, spec.n_dense)).astype(np.float32)
    ids = np.stack([rng.integers(0, f.vocab_size, batch_size) for f in spec.sparse], axis=1).reshape(batch_size, -1)
    for j, f in enumerate(spec.dense):
        if f.side == "request":
            dense[:, j] = dense[first, j]
    for j, f in enumerate(spec.sparse):
        if f.side == "request":
            ids[:, j] = ids[first, j]
    labels = rng.integers(0, 2, batch_size).astype(np.float32)
    history = {}
    for f in spec.sequence:
        lengths = rng.integers(0, f.max_len + 1, batch_size)[first]
        padded = rng.integers(1, f.vocab_size, (batch_size, f.max_len))[first]
        padded[np.arange(f.max_len) < (f.max_len - lengths)[:, None]] = 0  # pads first
        history[f.name] = (padded, lengths)
    return make_batch(dense, ids, labels, request_ids, keys=spec.sparse_names, history=history or None)
