"""The batch every model and training loop sees."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass
class Batch:
    """One mini-batch.

    Attributes:
        dense: ``(B, n_dense)`` float32, in the spec's storage order.
        sparse: a torchrec ``KeyedJaggedTensor`` with one key per sparse feature (spec order),
            one id per row and key (length 1), ids in ``[0, vocab_size)``.
        labels: ``(B,)`` float32 in {0, 1}.
        request_ids: ``(B,)`` int64; rows of one request are contiguous within a batch.
        probs: ``(B,)`` float32 true click probabilities when the source knows them (synthetic),
            else ``None``.
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    labels: torch.Tensor
    request_ids: torch.Tensor
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(torch.device(device), non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            request_ids=self.request_ids.to(device, non_blocking=non_blocking),
            probs=None if self.probs is None else self.probs.to(device, non_blocking=non_blocking),
        )

    def sparse_ids(self) -> torch.Tensor:
        """The ids as a dense ``(B, n_sparse)`` int64 tensor (spec order)."""
        B = len(self)
        # KJT values are key-major: all rows of key 0, then key 1, ... -> (n_sparse, B) -> (B, n_sparse)
        return self.sparse.values().view(len(self.sparse.keys()), B).t()


def make_batch(
    dense: np.ndarray | torch.Tensor,
    sparse_ids: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    request_ids: np.ndarray | torch.Tensor,
    keys: list[str],
    probs: np.ndarray | torch.Tensor | None = None,
) -> Batch:
    """Build a :class:`Batch` from row-major arrays; ``sparse_ids`` is ``(B, n_sparse)``.

    >>> b = make_batch(np.zeros((2, 1)), np.array([[1, 2], [3, 4]]), np.array([0, 1]),
    ...                np.array([7, 7]), keys=["a", "b"])
    >>> b.sparse["b"].values().tolist(), b.sparse_ids().tolist()
    ([2, 4], [[1, 2], [3, 4]])
    """
    ids = torch.as_tensor(np.asarray(sparse_ids), dtype=torch.int64)
    B, n_sparse = ids.shape
    if n_sparse != len(keys):
        raise ValueError(f"sparse ids have {n_sparse} columns but {len(keys)} keys were given")
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys),
        values=ids.t().contiguous().view(-1),  # (n_sparse, B) flattened: key-major layout
        lengths=torch.ones(B * n_sparse, dtype=torch.int32),
    )
    return Batch(
        dense=torch.as_tensor(np.asarray(dense), dtype=torch.float32),
        sparse=kjt,
        labels=torch.as_tensor(np.asarray(labels), dtype=torch.float32),
        request_ids=torch.as_tensor(np.asarray(request_ids), dtype=torch.int64),
        probs=None if probs is None else torch.as_tensor(np.asarray(probs), dtype=torch.float32),
    )


def concat_batches(batches: list[Batch]) -> Batch:
    """The rows of ``batches`` (at least one, same keys) as one batch, in order.

    >>> a = make_batch(np.zeros((1, 1)), np.array([[1, 2]]), np.array([0]), np.array([7]), keys=["a", "b"])
    >>> b = make_batch(np.ones((2, 1)), np.array([[3, 4], [5, 6]]), np.array([1, 1]), np.array([8, 9]), keys=["a", "b"])
    >>> ab = concat_batches([a, b])
    >>> len(ab), ab.sparse["a"].values().tolist(), ab.dense.flatten().tolist(), ab.probs
    (3, [1, 3, 5], [0.0, 1.0, 1.0], None)
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    probs = [b.probs for b in batches]
    return make_batch(
        torch.cat([b.dense for b in batches]), torch.cat([b.sparse_ids() for b in batches]),
        torch.cat([b.labels for b in batches]), torch.cat([b.request_ids for b in batches]),
        list(batches[0].sparse.keys()), None if any(p is None for p in probs) else torch.cat(probs),
    )
