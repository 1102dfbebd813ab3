"""The cached data set format, write side: building a data directory, and the cache of built ones.

Writers (:class:`StoreWriter`) stream chunks into ``np.lib.format.open_memmap`` files in a
temporary sibling directory and rename it into place when complete, so a half-written directory is
never mistaken for a finished one. Rows per split are fixed up front (the sources count them
first), and a request never straddles splits (see :mod:`rankitect.data.hashing`). The layout
written is :mod:`rankitect.data.clickdata`'s, which reads it back.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rankitect.data.clickdata import FORMAT, FORMAT_VERSION, ClickData, _SplitStats, format_version, is_data_dir
from rankitect.data.hashing import SPLITS
from rankitect.data.spec import FeatureSpec
from rankitect.errors import DataError


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


class StoreWriter:
    """Stream rows into a new data directory; ``rows`` fixes each split's size up front.

    Use as a context manager; :meth:`close` checks every split got exactly its rows, writes
    ``spec.json`` and ``meta.json`` and moves the directory into place (replacing an older data
    directory there). Leaving the block by an exception removes the partial files.
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
            for f in spec.sequence:  # right-aligned ids and their count per row
                shapes[f"history_{f.name}"] = ((n, f.max_len), np.int32 if f.vocab_size <= 2**31 - 1 else np.int64)
                shapes[f"history_{f.name}_lengths"] = ((n,), np.int32)
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
        probs: np.ndarray | None = None, history: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """Append rows ``(dense (n, n_dense), sparse (n, n_sparse), labels (n,), request_ids (n,))``;
        ``history`` maps every sequence feature of the spec to ``(ids (n, max_len), lengths (n,))``,
        ids right-aligned (pads of 0 first, the latest id last)."""
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
        for name, (ids, lengths) in self._checked_history(split, n, history).items():
            arrs[f"history_{name}"][i:i + n] = ids
            arrs[f"history_{name}_lengths"][i:i + n] = lengths
        self.cursor[split] = i + n
        self.stats[split].update(np.asarray(labels, np.float64), np.asarray(request_ids), probs)

    def _checked_history(
        self, split: str, n: int, history: Mapping[str, tuple[np.ndarray, np.ndarray]] | None
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``history`` checked against the spec's sequence features (every one given, shapes, ids in
        the vocabulary, lengths within ``max_len``, positions before a row's ids all 0)."""
        history = dict(history or {})
        names = [f.name for f in self.spec.sequence]
        if sorted(history) != sorted(names):
            raise ValueError(f"split {split!r}: histories {sorted(history)} given, the spec has {sorted(names)}")
        out = {}
        for f in self.spec.sequence:
            ids, lengths = np.asarray(history[f.name][0]), np.asarray(history[f.name][1])
            if ids.shape != (n, f.max_len) or lengths.shape != (n,):
                raise ValueError(f"split {split!r}: history {f.name!r} must be ids ({n}, {f.max_len}) and lengths "
                                 f"({n},), got {ids.shape} and {lengths.shape}")
            if n and (((ids < 0) | (ids >= f.vocab_size)).any() or ((lengths < 0) | (lengths > f.max_len)).any()):
                raise ValueError(f"split {split!r}: history {f.name!r}: ids outside [0, {f.vocab_size}) or lengths "
                                 f"outside [0, {f.max_len}]")
            pads = np.arange(f.max_len) < (f.max_len - lengths)[:, None]  # (n, L): the positions before the ids
            if n and ids[pads].any():
                raise ValueError(f"split {split!r}: history {f.name!r}: ids must be right-aligned (pads of 0 first)")
            out[f.name] = (ids, lengths)
        return out

    def write_routed(
        self, codes: np.ndarray, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
        request_ids: np.ndarray, probs: np.ndarray | None = None,
        history: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """Append rows to the split named by ``codes`` (0 train, 1 val, 2 test) row by row."""
        for k, s in enumerate(SPLITS):
            m = codes == k
            if m.any():
                part = None if history is None else {name: (ids[m], n[m]) for name, (ids, n) in history.items()}
                self.write(s, dense[m], sparse[m], labels[m], request_ids[m], None if probs is None else probs[m],
                           part)

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
        if (key is not None and is_data_dir(self.out_dir) and format_version(self.out_dir) == FORMAT_VERSION
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


def cached(out_dir: Path, cache_key: str, build: Callable[[Path], ClickData]) -> ClickData:
    """Open ``out_dir`` when it holds a data set built with ``cache_key``; else ``build(out_dir)``.

    ``build`` must store ``cache_key`` under ``meta["cache_key"]``. Processes that start together
    build it once: the first builds under a lock file beside ``out_dir``, the others then open it.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(out_dir.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_data_dir(out_dir) and format_version(out_dir) == FORMAT_VERSION:
                data = ClickData.open(out_dir)
                if data.meta.get("cache_key") == cache_key:
                    return data
            return build(out_dir)  # new, or written with other options or by an older version: rebuilt
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
