"""The batch every model and training loop sees."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

Array = np.ndarray | torch.Tensor


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
        history: a torchrec ``KeyedJaggedTensor`` with one key per sequence feature (spec order):
            each row's history ids, oldest first and latest last, as many as the row has (0 to
            ``max_len``); ``None`` when the data has no sequence feature.
            :meth:`history_padded` gives one key's ids as a padded tensor and its mask.
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    labels: torch.Tensor
    request_ids: torch.Tensor
    probs: torch.Tensor | None = None
    history: KeyedJaggedTensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(torch.device(device), non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            request_ids=self.request_ids.to(device, non_blocking=non_blocking),
            probs=None if self.probs is None else self.probs.to(device, non_blocking=non_blocking),
            history=None if self.history is None else self.history.to(torch.device(device), non_blocking=non_blocking),
        )

    def sparse_ids(self) -> torch.Tensor:
        """The ids as a dense ``(B, n_sparse)`` int64 tensor (spec order)."""
        B = len(self)
        # KJT values are key-major: all rows of key 0, then key 1, ... -> (n_sparse, B) -> (B, n_sparse)
        return self.sparse.values().view(len(self.sparse.keys()), B).t()

    def history_padded(self, name: str, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """History ``name`` as ``(ids (B, L) int64, mask (B, L) bool)``, right-aligned: the pads come
        first and each row's latest id sits at position ``L - 1``, so a position means a recency.

        ``L`` is ``max_len`` (default: the longest history in the batch); a longer history keeps
        its latest ``L`` ids. Pads have id 0 and mask ``False``.

        >>> b = make_batch(np.zeros((2, 0)), np.zeros((2, 1)), np.zeros(2), np.arange(2), keys=["item"],
        ...                history={"clicks": (np.array([[0, 5, 6], [0, 0, 0]]), np.array([2, 0]))})
        >>> ids, mask = b.history_padded("clicks", 3)
        >>> ids.tolist(), mask.tolist()
        ([[0, 5, 6], [0, 0, 0]], [[False, True, True], [False, False, False]])
        """
        if self.history is None or name not in self.history.keys():
            keys = [] if self.history is None else self.history.keys()
            raise ValueError(f"batch: no history {name!r}; it has {keys}")
        jagged = self.history[name]
        return padded_history(jagged.values(), jagged.lengths(), max_len)


def padded_history(values: torch.Tensor, lengths: torch.Tensor, max_len: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged ids (``values``, each row's ``lengths`` ``(B,)``, latest last) as right-aligned
    ``(ids (B, L) int64, mask (B, L) bool)``; ``L`` is ``max_len`` or the longest row, and a
    longer row keeps its latest ``L`` ids.

    >>> ids, mask = padded_history(torch.tensor([1, 2, 3, 4]), torch.tensor([3, 1]), 2)
    >>> ids.tolist(), mask.tolist()
    ([[2, 3], [0, 4]], [[True, True], [False, True]])
    """
    lengths = lengths.long()
    B = int(lengths.shape[0])
    L = int(lengths.max()) if max_len is None and B else int(max_len or 0)
    row = torch.repeat_interleave(torch.arange(B, device=values.device), lengths)  # (n,) row of each id
    ends = torch.cumsum(lengths, 0)
    back = ends.index_select(0, row) - torch.arange(values.shape[0], device=values.device)  # 1 for the latest id
    keep = back <= L
    col = L - back[keep]  # the latest at L - 1
    ids = torch.zeros(B, L, dtype=torch.int64, device=values.device)
    mask = torch.zeros(B, L, dtype=torch.bool, device=values.device)
    ids[row[keep], col] = values[keep].long()
    mask[row[keep], col] = True
    return ids, mask


def history_kjt(history: Mapping[str, tuple[Array, Array]]) -> KeyedJaggedTensor:
    """A ``KeyedJaggedTensor`` of histories given as ``name -> (padded ids (B, L), lengths (B,))``,
    ids right-aligned (the latest at ``L - 1``, as the store keeps them): one key per name, in order."""
    values, lengths = [], []
    for name, (ids, length) in history.items():
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.int64)
        length = torch.as_tensor(np.asarray(length), dtype=torch.int64)
        if ids.dim() != 2 or length.shape != (ids.shape[0],):
            raise ValueError(f"history {name!r}: expected ids (B, L) and lengths (B,), got "
                             f"{tuple(ids.shape)} and {tuple(length.shape)}")
        if bool(((length < 0) | (length > ids.shape[1])).any()):
            raise ValueError(f"history {name!r}: lengths must lie in [0, {ids.shape[1]}]")
        L = ids.shape[1]
        mask = torch.arange(L) >= (L - length)[:, None]  # (B, L): the last `length` positions of each row
        values.append(ids[mask])  # row-major: each row's ids oldest first
        lengths.append(length)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(history), values=torch.cat(values) if values else torch.zeros(0, dtype=torch.int64),
        lengths=torch.cat(lengths).to(torch.int32) if lengths else torch.zeros(0, dtype=torch.int32),
    )


def make_batch(
    dense: np.ndarray | torch.Tensor,
    sparse_ids: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    request_ids: np.ndarray | torch.Tensor,
    keys: list[str],
    probs: np.ndarray | torch.Tensor | None = None,
    history: Mapping[str, tuple[Array, Array]] | KeyedJaggedTensor | None = None,
) -> Batch:
    """Build a :class:`Batch` from row-major arrays; ``sparse_ids`` is ``(B, n_sparse)``; ``history``
    maps each sequence feature to ``(right-aligned padded ids (B, L), lengths (B,))`` (see
    :func:`history_kjt`), or is a ``KeyedJaggedTensor`` already.

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
        history=history if history is None or isinstance(history, KeyedJaggedTensor) else history_kjt(history),
    )


def batch_history(
    batch: Batch, rows: slice | torch.Tensor | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``batch``'s histories as ``name -> (padded ids, lengths)`` (what :func:`make_batch` takes),
    of the rows ``rows`` (default all): how code that rebuilds a batch keeps its histories."""
    if batch.history is None:
        return {}
    out = {}
    for name in batch.history.keys():
        ids, mask = batch.history_padded(name)
        sel = slice(None) if rows is None else rows
        out[name] = (ids[sel], mask[sel].sum(dim=1))
    return out


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
        history=_concat_history(batches),
    )


def _concat_history(batches: list[Batch]) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """The histories of ``batches`` one after another (padded to the longest), or ``None``."""
    if batches[0].history is None:
        return None
    out = {}
    for name in batches[0].history.keys():
        parts = [b.history_padded(name) for b in batches]
        L = max(ids.shape[1] for ids, _ in parts)
        ids = torch.cat([torch.nn.functional.pad(i, (L - i.shape[1], 0)) for i, _ in parts])  # pads in front
        out[name] = (ids, torch.cat([m.sum(dim=1) for _, m in parts]))
    return out
