"""The cached data set format: one directory of ``.npy`` arrays per data set, opened with mmap.

Layout of a data directory::

    spec.json                 FeatureSpec (features, sides, vocab sizes)
    meta.json                 format, source, creation parameters, cache key, and per split:
                              rows, requests, positives, ctr, bayes_ne (null when unknown)
    train/dense.npy           float32 (R, n_dense)   columns in spec order
    train/sparse.npy          int32 or int64 (R, n_sparse), spec order, ids in [0, vocab_size)
    train/labels.npy          float32 (R,)
    train/request_ids.npy     int64 (R,); the rows of one request are contiguous
    train/probs.npy           float32 (R,), only when the true click probability is known
    val/...  test/...

Writers (:class:`StoreWriter`) stream chunks into ``np.lib.format.open_memmap`` files in a
temporary sibling directory and rename it into place when complete, so a half-written directory is
never mistaken for a finished one. Rows per split are fixed up front (the sources count them
first), and a request never straddles splits (see :mod:`rankitect.data.hashing`).
"""

from __future__ import annotations

import fcntl

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rankitect.data.batch import Batch, make_batch
from rankitect.data.hashing import SPLITS
from rankitect.data.spec import FeatureSpec
from rankitect.errors import DataError

FORMAT = "rankitect-clickdata"
FORMAT_VERSION = 2  # 2: the spec carries each dense column's training mean and std
ARRAYS: tuple[str, ...] = ("dense", "sparse", "labels", "request_ids", "probs")


def data_cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where cached data sets live: ``cache_dir``, else ``$RANKITECT_DATA_DIR``, else
    ``~/.cache/rankitect/data``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RANKITECT_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rankitect" / "data"


def file_cache_key(path: str | Path, options: Mapping[str, Any]) -> str:
    """A key that changes when the file (absolute path, size, mtime) or the options change."""
    p = Path(path).resolve()
    st = p.stat()
    blob = json.dumps([FORMAT_VERSION, str(p), st.st_size, st.st_mtime_ns, dict(options)], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def entropy(ctr: float) -> float:
    """Binary entropy in nats of a base rate (0 for 0 or 1)."""
    if ctr <= 0.0 or ctr >= 1.0:
        return 0.0
    return float(-(ctr * np.log(ctr) + (1 - ctr) * np.log1p(-ctr)))


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


class Split:
    """One split of a :class:`ClickData`: memory-mapped arrays plus their statistics."""

    def __init__(self, path: Path, name: str, spec: FeatureSpec, stats: Mapping[str, Any]) -> None:
        self.name, self.spec, self.stats = name, spec, dict(stats)
        self.dense = load_array(path / "dense.npy")
        self.sparse = load_array(path / "sparse.npy")
        self.labels = load_array(path / "labels.npy")
        self.request_ids = load_array(path / "request_ids.npy")
        self.probs = load_array(path / "probs.npy") if (path / "probs.npy").exists() else None
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

    def take(self, rows: np.ndarray | slice) -> Batch:
        """The rows ``rows`` (an index array or a slice) as one :class:`Batch`."""
        probs = None if self.probs is None else np.array(self.probs[rows])
        return make_batch(
            np.array(self.dense[rows]), np.array(self.sparse[rows]), np.array(self.labels[rows]),
            np.array(self.request_ids[rows]), keys=self.spec.sparse_names, probs=probs,
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
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        """Iterate the split in batches of ``batch_size`` rows.

        With ``shuffle`` the *requests* are permuted (by ``seed``; ``None`` draws fresh OS
        entropy), so the rows of a request stay contiguous and in order; a request may still be
        cut by a batch boundary. Without it the rows come in storage order. ``drop_last`` drops
        a final batch smaller than ``batch_size``.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        n = len(self)
        order = self.row_order(seed) if shuffle else None
        stop = n - n % batch_size if drop_last else n
        for i in range(0, stop, batch_size):
            j = min(i + batch_size, n)
            yield self.take(slice(i, j) if order is None else order[i:j])


class ClickData:
    """A cached data set: a :class:`FeatureSpec`, metadata and three :class:`Split` s.

    >>> import tempfile
    >>> from rankitect.data.spec import DenseFeature, SparseFeature
    >>> spec = FeatureSpec(dense=(DenseFeature("d"),), sparse=(SparseFeature("s", 5),))
    >>> out = Path(tempfile.mkdtemp()) / "tiny"
    >>> with StoreWriter(out, spec, {"train": 3, "val": 1, "test": 0}) as w:
    ...     w.write("train", np.ones((3, 1)), np.array([[1], [2], [3]]), np.array([0, 1, 1]), np.array([0, 0, 1]))
    ...     w.write("val", np.ones((1, 1)), np.array([[4]]), np.array([1]), np.array([2]))
    ...     data = w.close({"source": "doctest"})
    >>> tr = ClickData.open(out).split("train")
    >>> len(tr), round(tr.ctr, 3), tr.n_requests, [len(b) for b in tr.batches(2, shuffle=False)]
    (3, 0.667, 2, [2, 1])
    """

    def __init__(self, path: Path, spec: FeatureSpec, meta: dict[str, Any]) -> None:
        self.path, self.spec, self.meta = path, spec, meta
        self._splits: dict[str, Split] = {}

    @classmethod
    def open(cls, path: str | Path) -> ClickData:
        """Open a data directory written by :class:`StoreWriter` (arrays are memory-mapped)."""
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
        """The split ``name`` (``train``, ``val`` or ``test``)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        if name not in self._splits:
            self._splits[name] = Split(self.path / name, name, self.spec, self.meta["splits"][name])
        return self._splits[name]

    @property
    def source(self) -> str:
        return str(self.meta.get("source", "?"))

    def __repr__(self) -> str:
        rows = {s: self.meta["splits"][s]["rows"] for s in SPLITS}
        return f"ClickData({str(self.path)!r}, source={self.source!r}, rows={rows})"


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


class StoreWriter:
    """Stream rows into a new data directory; ``rows`` fixes each split's size up front.

    Use as a context manager; :meth:`close` checks every split got exactly its rows, writes
    ``spec.json`` and ``meta.json`` and moves the directory into place (replacing an older data
    directory there). Leaving the block by an exception removes the partial files.
    """

    def __init__(
        self, out_dir: str | Path, spec: FeatureSpec, rows: Mapping[str, int], *, with_probs: bool = False
    ) -> None:
        if set(rows) != set(SPLITS):
            raise ValueError(f"rows must give exactly the splits {SPLITS}, got {sorted(rows)}")
        self.out_dir, self.spec = Path(out_dir), spec
        self.expected = {s: int(rows[s]) for s in SPLITS}
        self.tmp = self.out_dir.parent / f".{self.out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir(parents=True)
        vmax = max((f.vocab_size for f in spec.sparse), default=2)
        sparse_dtype = np.int32 if vmax <= np.iinfo(np.int32).max else np.int64
        self.arrays: dict[str, dict[str, np.memmap]] = {}
        for s in SPLITS:
            (self.tmp / s).mkdir()
            n = self.expected[s]
            shapes = {"dense": ((n, spec.n_dense), np.float32), "sparse": ((n, spec.n_sparse), sparse_dtype),
                      "labels": ((n,), np.float32), "request_ids": ((n,), np.int64)}
            if with_probs:
                shapes["probs"] = ((n,), np.float32)
            self.arrays[s] = {k: np.lib.format.open_memmap(self.tmp / s / f"{k}.npy", mode="w+", dtype=dt, shape=sh)
                              for k, (sh, dt) in shapes.items()}
        self.cursor = dict.fromkeys(SPLITS, 0)
        self.stats = {s: _SplitStats() for s in SPLITS}

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()

    def write(
        self, split: str, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, request_ids: np.ndarray,
        probs: np.ndarray | None = None,
    ) -> None:
        """Append rows ``(dense (n, n_dense), sparse (n, n_sparse), labels (n,), request_ids (n,))``."""
        n, arrs = len(labels), self.arrays[split]
        i = self.cursor[split]
        if i + n > self.expected[split]:
            raise ValueError(f"split {split!r}: writing rows {i}..{i + n} past its declared {self.expected[split]}")
        if ("probs" in arrs) != (probs is not None):
            raise ValueError(f"split {split!r}: probs given={probs is not None} "
                             f"but the writer has with_probs={'probs' in arrs}")
        sparse = np.asarray(sparse)
        vocab = np.array([f.vocab_size for f in self.spec.sparse])
        if n and ((sparse < 0) | (sparse >= vocab)).any():
            raise ValueError(f"split {split!r}: sparse ids outside [0, vocab_size) per column {vocab.tolist()}")
        arrs["dense"][i:i + n] = dense
        arrs["sparse"][i:i + n] = sparse
        arrs["labels"][i:i + n] = labels
        arrs["request_ids"][i:i + n] = request_ids
        if probs is not None:
            arrs["probs"][i:i + n] = probs
        self.cursor[split] = i + n
        self.stats[split].update(np.asarray(labels, np.float64), np.asarray(request_ids), probs)

    def write_routed(
        self, codes: np.ndarray, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
        request_ids: np.ndarray, probs: np.ndarray | None = None,
    ) -> None:
        """Append rows to the split named by ``codes`` (0 train, 1 val, 2 test) row by row."""
        for k, s in enumerate(SPLITS):
            m = codes == k
            if m.any():
                self.write(s, dense[m], sparse[m], labels[m], request_ids[m], None if probs is None else probs[m])

    def close(self, meta: Mapping[str, Any]) -> ClickData:
        """Finish: check sizes, write spec and meta (``meta`` plus computed split stats), move into place."""
        short = {s: (self.cursor[s], self.expected[s]) for s in SPLITS if self.cursor[s] != self.expected[s]}
        if short:
            self.abort()
            raise ValueError(f"splits written != declared (written, declared): {short}")
        for arrs in self.arrays.values():
            for a in arrs.values():
                a.flush()
        self.spec = with_train_stats(self.spec, self.arrays["train"]["dense"])
        self.arrays = {}
        full = {"format": FORMAT, "format_version": FORMAT_VERSION, **dict(meta),
                "splits": {s: self.stats[s].as_dict() for s in SPLITS}}
        self.spec.save(self.tmp / "spec.json")
        (self.tmp / "meta.json").write_text(json.dumps(full, indent=2, default=str) + "\n")
        key = full.get("cache_key")
        if (key is not None and is_data_dir(self.out_dir) and _format_version(self.out_dir) == FORMAT_VERSION
                and ClickData.open(self.out_dir).meta.get("cache_key") == key):
            shutil.rmtree(self.tmp, ignore_errors=True)  # another process built the same data meanwhile
        else:
            _move_into_place(self.tmp, self.out_dir)
        return ClickData.open(self.out_dir)

    def abort(self) -> None:
        self.arrays = {}
        shutil.rmtree(self.tmp, ignore_errors=True)


def with_train_stats(spec: FeatureSpec, train_dense: np.ndarray, chunk: int = 1 << 20) -> FeatureSpec:
    """``spec`` with each dense column's mean and standard deviation over the training split (read in
    chunks of ``chunk`` rows, accumulated in float64); a spec without dense features or an empty
    split is returned as it is."""
    n = train_dense.shape[0]
    if spec.n_dense == 0 or n == 0:
        return spec
    total, squares = np.zeros(spec.n_dense), np.zeros(spec.n_dense)
    for start in range(0, n, chunk):
        x = np.asarray(train_dense[start:start + chunk], dtype=np.float64)
        total += x.sum(axis=0)
        squares += np.square(x).sum(axis=0)
    mean = total / n
    return spec.with_dense_stats(mean, np.sqrt(np.maximum(squares / n - mean**2, 0.0)))


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; an older data directory there is replaced, anything else refused."""
    old = None
    if out_dir.exists():
        if not is_data_dir(out_dir) and any(out_dir.iterdir()):
            shutil.rmtree(tmp, ignore_errors=True)
            raise DataError("exists and is not a rankitect data directory; refusing to overwrite", path=str(out_dir))
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_data_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a finished data directory (its meta.json names this format)."""
    meta = Path(path) / "meta.json"
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def _format_version(path: Path) -> Any:
    return json.loads((path / "meta.json").read_text()).get("format_version")


def cached(out_dir: Path, cache_key: str, build: Callable[[Path], ClickData]) -> ClickData:
    """Open ``out_dir`` when it holds a data set built with ``cache_key``; else ``build(out_dir)``.

    ``build`` must store ``cache_key`` under ``meta["cache_key"]``. Processes that start together
    build it once: the first builds under a lock file beside ``out_dir``, the others then open it.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(out_dir.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_data_dir(out_dir) and _format_version(out_dir) == FORMAT_VERSION:
                data = ClickData.open(out_dir)
                if data.meta.get("cache_key") == cache_key:
                    return data
            return build(out_dir)  # new, or written with other options or by an older version: rebuilt
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
