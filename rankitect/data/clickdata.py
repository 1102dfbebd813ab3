"""The cached data set format, read side: one directory of ``.npy`` arrays per data set, opened with mmap.

Layout of a data directory::

    spec.json                 FeatureSpec (features, sides, vocab sizes)
    meta.json                 format, source, creation parameters, cache key, and per split:
                              rows, requests, positives, ctr, bayes_ne (null when unknown)
    train/dense.npy           float32 (R, n_dense)   columns in spec order
    train/sparse.npy          int32 or int64 (R, n_sparse), spec order, ids in [0, vocab_size)
    train/labels.npy          float32 (R,)
    train/request_ids.npy     int64 (R,); the rows of one request are contiguous
    train/probs.npy           float32 (R,), only when the true click probability is known
    train/history_<name>.npy  int32 (R, max_len) per sequence feature: ids right-aligned (pads of 0
                              first, the latest id last)
    train/history_<name>_lengths.npy  int32 (R,): how many of a row's positions hold ids
    val/...  test/...

:class:`ClickData` opens a finished directory and hands out its :class:`Split` s; writing one (and
the cache of built data sets) is :mod:`rankitect.data.store`'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rankitect.data.batch import Batch, make_batch
from rankitect.data.hashing import SPLITS, request_splits
from rankitect.data.spec import FeatureSpec
from rankitect.errors import DataError

FORMAT = "rankitect-clickdata"
FORMAT_VERSION = 2  # 2: the spec carries each dense column's training mean and std
ARRAYS: tuple[str, ...] = ("dense", "sparse", "labels", "request_ids", "probs")
VERDICT = "verdict"  # the held-out part of the validation split (ClickData.with_verdict)
VERDICT_SALT = 0x7E5D1C7  # its request hash's salt, apart from the split hash's seeds


def load_array(path: Path, *, mmap: bool = True) -> np.ndarray:
    """A plain numeric ``.npy`` array, memory-mapped (or read, ``mmap=False``); a file that is not
    one (a pickled object array among them: never unpickled, so no code runs) is a
    :class:`DataError` naming the file."""
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"not a plain numeric .npy array ({e}); delete the data directory to rebuild it",
                        path=str(path)) from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise DataError(f"not a plain numeric .npy array (dtype {getattr(array, 'dtype', '?')}); delete the data "
                        "directory to rebuild it", path=str(path))
    return array


def entropy(ctr: float) -> float:
    """Binary entropy in nats of a base rate (0 for 0 or 1)."""
    if ctr <= 0.0 or ctr >= 1.0:
        return 0.0
    return float(-(ctr * np.log(ctr) + (1 - ctr) * np.log1p(-ctr)))


class _SplitStats:
    """Running statistics of one split while it is written."""

    def __init__(self) -> None:
        self.rows, self.positives, self.requests, self.ll_sum = 0, 0.0, 0, 0.0
        self.last_request: int | None = None
        self.has_probs = True

    def update(self, labels: np.ndarray, request_ids: np.ndarray, probs: np.ndarray | None) -> None:
        if len(labels) == 0:
            return
        self.rows += len(labels)
        self.positives += float(labels.sum(dtype=np.float64))
        new = int(np.count_nonzero(request_ids[1:] != request_ids[:-1])) + 1
        self.requests += new - (1 if self.last_request == int(request_ids[0]) else 0)
        self.last_request = int(request_ids[-1])
        if probs is None:
            self.has_probs = False
        else:
            p = np.clip(probs.astype(np.float64), 1e-12, 1 - 1e-12)
            self.ll_sum -= float(np.sum(labels * np.log(p) + (1 - labels) * np.log1p(-p)))

    def as_dict(self) -> dict[str, Any]:
        ctr = self.positives / self.rows if self.rows else 0.0
        h = entropy(ctr)
        bayes = self.ll_sum / self.rows / h if (self.has_probs and self.rows and h > 0) else None
        return {"rows": self.rows, "requests": self.requests, "positives": int(self.positives),
                "ctr": ctr, "bayes_ne": bayes}

def split_stats(labels: np.ndarray, request_ids: np.ndarray, probs: np.ndarray | None) -> dict[str, Any]:
    """A split's statistics (rows, requests, positives, ctr, bayes_ne) from its arrays in storage order."""
    stats = _SplitStats()
    stats.update(np.asarray(labels, np.float64), np.asarray(request_ids), None if probs is None else np.asarray(probs))
    return stats.as_dict()


class Split:
    """One split of a :class:`ClickData`: memory-mapped arrays plus their statistics."""

    def __init__(self, path: Path, name: str, spec: FeatureSpec, stats: Mapping[str, Any]) -> None:
        self.name, self.spec, self.stats = name, spec, dict(stats)
        self.dense = load_array(path / "dense.npy")
        self.sparse = load_array(path / "sparse.npy")
        self.labels = load_array(path / "labels.npy")
        self.request_ids = load_array(path / "request_ids.npy")
        self.probs = load_array(path / "probs.npy") if (path / "probs.npy").exists() else None
        # name -> (ids (R, max_len), lengths (R,)) per sequence feature
        self.history = {f.name: (load_array(path / f"history_{f.name}.npy"),
                                 load_array(path / f"history_{f.name}_lengths.npy")) for f in spec.sequence}
        self._starts: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        return f"Split({self.name!r}, rows={len(self)}, ctr={self.ctr:.4f})"

    @property
    def ctr(self) -> float:
        """Observed click-through rate (mean label)."""
        return float(self.stats["ctr"])

    @property
    def bayes_ne(self) -> float | None:
        """NE of the true click probabilities (the floor no model beats), ``None`` when unknown."""
        v = self.stats.get("bayes_ne")
        return None if v is None else float(v)

    @property
    def n_requests(self) -> int:
        return int(self.stats["requests"])

    def request_starts(self) -> np.ndarray:
        """Row index where each request begins, plus ``len(self)`` at the end: ``(n_requests + 1,)``."""
        if self._starts is None:
            rid = np.asarray(self.request_ids)
            change = np.flatnonzero(rid[1:] != rid[:-1]) + 1
            self._starts = np.concatenate([[0] if len(rid) else [], change, [len(rid)]]).astype(np.int64)
        return self._starts

    def subset(self, rows: np.ndarray, name: str) -> Split:
        """The rows ``rows`` (indices in storage order; whole requests, so requests stay contiguous)
        as a split of their own named ``name``, its per-row arrays held in memory and its statistics
        (rows, requests, clicks, CTR, Bayes NE) its own.

        >>> import tempfile
        >>> from rankitect.data.synthetic import generate_synthetic
        >>> val = generate_synthetic(tempfile.mkdtemp() + "/s", rows=2000).split("val")
        >>> part = val.subset(np.arange(val.request_starts()[3]), "first3")
        >>> part.n_requests, len(part) == int(val.request_starts()[3]), int(part.labels.sum()) == part.stats["positives"]
        (3, True, True)
        """
        rows = np.asarray(rows, dtype=np.int64)
        part = object.__new__(type(self))
        part.__dict__.update(self.__dict__)
        for key in ARRAYS:
            value = getattr(self, key)
            setattr(part, key, None if value is None else np.asarray(value[rows]))
        part.history = {name: (np.asarray(ids[rows]), np.asarray(lengths[rows]))  # each sequence feature's rows
                        for name, (ids, lengths) in self.history.items()}
        part.name, part._starts = name, None
        part.stats = split_stats(part.labels, part.request_ids, part.probs)
        return part

    def take(self, rows: np.ndarray | slice) -> Batch:
        """The rows ``rows`` (an index array or a slice) as one :class:`Batch`."""
        probs = None if self.probs is None else np.array(self.probs[rows])
        history = {name: (np.array(ids[rows]), np.array(lengths[rows]))
                   for name, (ids, lengths) in self.history.items()}
        return make_batch(
            np.array(self.dense[rows]), np.array(self.sparse[rows]), np.array(self.labels[rows]),
            np.array(self.request_ids[rows]), keys=self.spec.sparse_names, probs=probs, history=history or None,
        )

    def row_order(self, seed: int | np.random.Generator | None) -> np.ndarray:
        """All row indices with the requests in a random order (rows of a request stay together)."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        starts = self.request_starts()
        perm = rng.permutation(len(starts) - 1)
        first, lengths = starts[:-1][perm], np.diff(starts)[perm]
        # row k of the output belongs to request j = the one whose output range holds k;
        # its row is first[j] + (k - offset[j]): repeat (first - offset) per row, add arange.
        offsets = np.cumsum(lengths) - lengths
        return np.repeat(first - offsets, lengths) + np.arange(len(self), dtype=np.int64)

    def batches(
        self, batch_size: int, *, shuffle: bool, seed: int | np.random.Generator | None = None,
        drop_last: bool = False, merge_last: bool = False,
    ) -> Iterator[Batch]:
        """Iterate the split in batches of ``batch_size`` rows.

        With ``shuffle`` the *requests* are permuted (by ``seed``; ``None`` draws fresh OS
        entropy), so the rows of a request stay contiguous and in order; a request may still be
        cut by a batch boundary. Without it the rows come in storage order. ``drop_last`` drops
        a final batch smaller than ``batch_size``; ``merge_last`` joins it to the batch before it
        (when there is one), so no batch has fewer than ``batch_size`` rows and no row is left out:
        how training passes are cut (see :func:`epoch_batches`).
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        n = len(self)
        order = self.row_order(seed) if shuffle else None
        stop = n - n % batch_size if drop_last else n
        bounds = [*range(0, stop, batch_size), stop]
        if merge_last and len(bounds) > 2 and stop % batch_size:
            del bounds[-2]
        for i, j in zip(bounds, bounds[1:]):
            yield self.take(slice(i, j) if order is None else order[i:j])


def epoch_batches(rows: int, batch_size: int) -> int:
    """The batches of one training pass over ``rows`` rows (at least one).

    A training pass joins a final batch smaller than ``batch_size`` to the batch before it
    (``Split.batches(..., merge_last=True)``). The loss is a mean over the batch, so a batch of a
    few rows is a full optimizer step taken on those few examples' gradient. On a split of 159,745
    rows at batch size 512, that was a batch of one row at the end of every epoch. It undid the
    epoch's progress: the validation NE of DeepFM went from 0.90 before it to 1.10 after it.

    >>> epoch_batches(1_050, 100), epoch_batches(1_000, 100), epoch_batches(60, 100)
    (10, 10, 1)
    """
    return max(1, rows // batch_size)


class ClickData:
    """A cached data set: a :class:`FeatureSpec`, metadata and three :class:`Split` s.

    The split arrays are memory-mapped; a directory of another format or version is a
    :class:`DataError` naming it (see :meth:`open`).
    """

    def __init__(self, path: Path, spec: FeatureSpec, meta: dict[str, Any]) -> None:
        self.path, self.spec, self.meta = path, spec, meta
        self._splits: dict[str, Split] = {}

    @classmethod
    def open(cls, path: str | Path) -> ClickData:
        """Open a data directory written by :class:`~rankitect.data.store.StoreWriter` (arrays are memory-mapped)."""
        p = Path(path)
        if not p.is_dir():
            raise DataError("no such data directory", path=str(p))
        if not (p / "meta.json").is_file() or not (p / "spec.json").is_file():
            raise DataError("not a rankitect data directory (spec.json / meta.json missing)", path=str(p))
        meta = json.loads((p / "meta.json").read_text())
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise DataError(
                f"unsupported data format {meta.get('format')!r} version {meta.get('format_version')!r}; "
                f"expected {FORMAT!r} version {FORMAT_VERSION} (delete the directory to rebuild it)", path=str(p))
        return cls(p, FeatureSpec.load(p / "spec.json"), meta)

    def split(self, name: str) -> Split:
        """The split ``name`` (``train``, ``val`` or ``test``; ``verdict`` where :meth:`with_verdict` carved one)."""
        if name in self._splits:
            return self._splits[name]
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        if name not in self._splits:
            self._splits[name] = Split(self.path / name, name, self.spec, self.meta["splits"][name])
        return self._splits[name]

    def with_verdict(self, fraction: float) -> ClickData:
        """This data set with ``fraction`` of its validation requests held out as a split of their own,
        ``verdict`` (by a hash of the request id, so every process carves the same rows); ``val``
        is the rest. Nothing that trains, stops, prunes or ranks models reads ``verdict``: only the
        search's final choice does (:mod:`rankitect.search.judging.verdict`). ``fraction`` 0, or a
        validation split too small to give both parts a request, leaves the data as it is.

        >>> import tempfile
        >>> from rankitect.data.synthetic import generate_synthetic
        >>> data = generate_synthetic(tempfile.mkdtemp() + "/s", rows=4000)
        >>> carved = data.with_verdict(0.5)
        >>> len(carved.split("val")) + len(carved.split("verdict")) == len(data.split("val")), carved.has_verdict
        (True, True)
        """
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"the verdict's share of the validation split must be in [0, 1), got {fraction!r}")
        val = self.split("val")
        if fraction == 0.0:
            return self
        codes = request_splits(np.asarray(val.request_ids), (1.0 - fraction, fraction, 0.0), VERDICT_SALT)
        kept, held = np.flatnonzero(codes == 0), np.flatnonzero(codes == 1)
        if len(kept) == 0 or len(held) == 0:
            return self
        carved = ClickData(self.path, self.spec, self.meta)
        carved._splits = {**self._splits, "val": val.subset(kept, "val"), VERDICT: val.subset(held, VERDICT)}
        return carved

    @property
    def has_verdict(self) -> bool:
        """Whether :meth:`with_verdict` carved a ``verdict`` split out of the validation rows."""
        return VERDICT in self._splits

    @property
    def source(self) -> str:
        return str(self.meta.get("source", "?"))

    def __repr__(self) -> str:
        rows = {s: self.meta["splits"][s]["rows"] for s in SPLITS}
        return f"ClickData({str(self.path)!r}, source={self.source!r}, rows={rows})"


def is_data_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a finished data directory (its meta.json names this format)."""
    meta = Path(path) / "meta.json"
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def format_version(path: Path) -> Any:
    """The format version a data directory's meta.json records."""
    return json.loads((path / "meta.json").read_text()).get("format_version")
