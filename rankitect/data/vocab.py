"""Counted vocabularies over hashed categorical values (uint64 hashes -> ids).

Ids: 0 = missing (never produced here), 1 = out of vocabulary (rare or unseen), ``2 ..`` = the
kept values, most frequent first (ties by hash), so ``size = 2 + kept``.

>>> c = VocabCounter()
>>> c.update(np.array([5, 5, 5, 7, 7, 9], dtype=np.uint64))
>>> v = c.build(min_count=2, vocab_size=100)
>>> v.size, v.lookup(np.array([5, 7, 9, 11], dtype=np.uint64)).tolist()
(4, [2, 3, 1, 1])
"""

from __future__ import annotations

import numpy as np

OOV_ID = 1


class Vocab:
    """A fixed map from value hashes to ids (see the module docstring)."""

    def __init__(self, hashes: np.ndarray) -> None:
        """``hashes``: the kept values' hashes, id order (the first gets id 2)."""
        order = np.argsort(hashes, kind="stable")
        self.sorted = np.asarray(hashes, dtype=np.uint64)[order]
        self.ids = (order + 2).astype(np.int64)
        self.size = 2 + len(hashes)

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Ids ``(n,)`` of ``hashes`` ``(n,)``; values not kept get :data:`OOV_ID`."""
        h = np.asarray(hashes, dtype=np.uint64)
        if len(self.sorted) == 0:
            return np.full(len(h), OOV_ID, dtype=np.int64)
        pos = np.searchsorted(self.sorted, h).clip(max=len(self.sorted) - 1)
        return np.where(self.sorted[pos] == h, self.ids[pos], OOV_ID)


class VocabCounter:
    """Counts hashes chunk by chunk; memory grows with the number of distinct values."""

    def __init__(self) -> None:
        self.values = np.empty(0, np.uint64)
        self.counts = np.empty(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_len = 0

    def update(self, hashes: np.ndarray) -> None:
        u, c = np.unique(np.asarray(hashes, dtype=np.uint64), return_counts=True)
        self._pending.append((u, c))
        self._pending_len += len(u)
        if self._pending_len > max(1 << 20, 2 * len(self.values)):  # amortize the merges
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        vals = np.concatenate([self.values] + [u for u, _ in self._pending])
        cnts = np.concatenate([self.counts] + [c for _, c in self._pending])
        self.values, inverse = np.unique(vals, return_inverse=True)
        self.counts = np.bincount(inverse, weights=cnts, minlength=len(self.values)).astype(np.int64)
        self._pending, self._pending_len = [], 0

    def build(self, min_count: int, vocab_size: int) -> Vocab:
        """Keep values seen ``>= min_count`` times, at most ``vocab_size - 2`` (most frequent)."""
        if vocab_size < 3:
            raise ValueError(f"vocab_size must be >= 3, got {vocab_size}")
        self._merge()
        keep = self.counts >= max(min_count, 1)
        vals, cnts = self.values[keep], self.counts[keep]
        order = np.lexsort((vals, -cnts))[: vocab_size - 2]  # by count descending, then hash
        return Vocab(vals[order])
