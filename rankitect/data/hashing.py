"""Stable, vectorized hashing: split assignment by request and categorical values to ids.

Everything here is a pure function of its inputs (no process-salted ``hash()``), so the same file
gives the same ids and the same splits on every machine and every run.

* Integers (request ids) go through SplitMix64 (Steele et al. 2014's finalizer), a bijective
  64-bit mixer, salted by XOR-ing the salt into the input.
* Strings go through pandas' SipHash-2-4 (``pandas.util.hash_array``) keyed by a 16-character key
  derived from the salt (one salt per column, so equal strings in two columns land in unrelated
  buckets).
* A request goes to a split by where ``hash(request id) / 2**64`` falls in the cumulative
  fractions (default 80/10/10): train ``[0, 0.8)``, val ``[0.8, 0.9)``, test ``[0.9, 1)``. All rows of
  a request share its id, so a request never straddles splits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.8, 0.1, 0.1)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray, salt: int = 0) -> np.ndarray:
    """SplitMix64 finalizer of ``x ^ salt`` as uint64 (array in, array out; wraps mod 2**64).

    >>> splitmix64(np.array([0, 1, 2])).tolist() == splitmix64(np.array([0, 1, 2])).tolist()
    True
    >>> len(set(splitmix64(np.arange(1000)).tolist()))  # bijective: no collisions
    1000
    """
    z = np.asarray(x).astype(np.uint64) ^ np.uint64(salt % 2**64)
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash_strings(values: np.ndarray, salt: int) -> np.ndarray:
    """SipHash-2-4 of each string (object array) keyed by ``salt``, as uint64."""
    key = f"{salt % 10**16:016d}"  # hash_array wants a 16-character key
    return pd.util.hash_array(np.asarray(values, dtype=object), hash_key=key, categorize=False)


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    """Validate (train, val, test) fractions: three non-negative numbers summing to 1."""
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or min(fr) < 0 or abs(sum(fr) - 1.0) > 1e-6 or fr[0] == 0:
        raise ValueError(f"split fractions must be 3 non-negative numbers summing to 1 with train > 0, "
                         f"got {fractions!r}")
    return fr  # type: ignore[return-value]


def split_codes(keys: np.ndarray, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> np.ndarray:
    """Split index (0 train, 1 val, 2 test) of each uint64 hash ``keys``, as int8.

    >>> codes = split_codes(splitmix64(np.arange(100_000)))
    >>> [round(float((codes == s).mean()), 2) for s in range(3)]
    [0.8, 0.1, 0.1]
    """
    fr = check_fractions(fractions)
    unit = (np.asarray(keys, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1)
    edges = np.cumsum(fr)[:2]
    return np.searchsorted(edges, unit, side="right").astype(np.int8)


def request_splits(
    request_ids: np.ndarray, fractions: Sequence[float] = DEFAULT_FRACTIONS, seed: int = 0
) -> np.ndarray:
    """Split index of integer request ids (see the module docstring), as int8."""
    return split_codes(splitmix64(request_ids, salt=seed), fractions)


def buckets(hashes: np.ndarray, vocab_size: int) -> np.ndarray:
    """Map uint64 hashes to ids ``1 .. vocab_size - 1`` (id 0 stays free for "missing")."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return (np.asarray(hashes, dtype=np.uint64) % np.uint64(vocab_size - 1)).astype(np.int64) + 1
