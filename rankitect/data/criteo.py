"""The Criteo reader: raw Kaggle / Terabyte TSV files into a cached data directory.

Input layout, one row per line, tab-separated, no header: ``label`` (0/1), 13 integer features
``I1..I13`` (empty when missing, ``-1`` and other negatives occur) and 26 categorical features
``C1..C26`` (8 hex digits, empty when missing). Blank lines are skipped; CRLF line ends are fine.

Transforms (fixed and documented, as in DLRM's and FuxiCTR's Criteo pipelines):

* dense: ``log(1 + max(x, 0))``; a missing (empty) value is 0 (the same as ``x <= 0``); a value that
  is not a finite number (``inf``, ``nan``, ``1e400``) is an error naming its line and column.
* categorical, by default (``min_count=0``): SipHash of the string, salted per column
  (:func:`rankitect.data.hashing.hash_strings`), into ``vocab_size - 1`` buckets: ids
  ``1 .. vocab_size - 1``; id 0 = missing. One pass, memory flat, every column ``vocab_size`` ids.
* with ``min_count > 0``: a first pass counts every value on the *train* rows; values seen at
  least ``min_count`` times get their own id (``2 ..``, most frequent first, at most
  ``vocab_size - 2`` of them); all other values share id 1; id 0 = missing. A column's vocabulary
  is then exactly as large as it needs to be (``min_count=10`` is the usual choice for Criteo).
  Memory grows with the number of distinct train values.

Every row is its own request (request id = 0-based row number), so splits are by row hash
(80/10/10 by default). All features are candidate side unless named in ``request_features``.

The result is cached: the key is the file's absolute path, size and mtime plus every option, so
a second call with the same file and options opens the cache without reading the TSV.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankitect.data.hashing import DEFAULT_FRACTIONS, SPLITS, buckets, check_fractions, hash_strings, request_splits
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.data.clickdata import ClickData
from rankitect.data.store import StoreWriter, cached, data_cache_root, file_cache_key
from rankitect.data.vocab import Vocab, VocabCounter
from rankitect.errors import DataError

READER_VERSION = 1
N_INT, N_CAT = 13, 26
N_COLS = 1 + N_INT + N_CAT
INT_NAMES = tuple(f"I{i + 1}" for i in range(N_INT))
CAT_NAMES = tuple(f"C{i + 1}" for i in range(N_CAT))
DEFAULT_VOCAB_SIZE = 100_000
DEFAULT_CHUNK_BYTES = 16 << 20
_DTYPES = {i: (np.float64 if i <= N_INT else object) for i in range(N_COLS)}  # label, ints, categoricals
_NUMERIC_NA = {i: [""] for i in range(1 + N_INT)}
_EMPTY = np.array([""], dtype=object)


def _iter_blocks(path: Path, chunk_bytes: int, bar: tqdm | None = None) -> Iterator[tuple[bytes, np.ndarray]]:
    """Blocks of whole lines, each with the 1-based line numbers of its non-blank lines.

    Every line is checked to have 40 tab-separated columns (vectorized over the block).
    """
    line0 = 1  # number of the first line of the next block
    tail = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            if bar is not None:
                bar.update(len(chunk))
            buf = tail + chunk
            if not chunk:
                if buf:
                    buf += b"\n"  # last line without a newline
                else:
                    return
            cut = buf.rfind(b"\n") + 1 if chunk else len(buf)
            block, tail = buf[:cut], buf[cut:]
            if block:
                lines = _check_lines(block, line0, path)
                line0 += block.count(b"\n")
                yield block, lines
            if not chunk:
                return


def _check_lines(block: bytes, line0: int, path: Path) -> np.ndarray:
    """Line numbers of the non-blank lines of ``block``; a wrong column count is a DataError."""
    a = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(a == 10)  # block ends with b"\n", so every line has an end
    starts = np.concatenate([[0], ends[:-1] + 1])
    tabs_before = np.searchsorted(np.flatnonzero(a == 9), ends)  # tabs before each line end
    ntabs = np.diff(tabs_before, prepend=0)
    length = ends - starts
    cr = length > 0
    cr[cr] = a[ends[cr] - 1] == 13
    blank = (length - cr) == 0
    bad = np.flatnonzero(~blank & (ntabs != N_COLS - 1))
    if len(bad):
        k = bad[0]
        raise DataError(f"wrong number of columns: {ntabs[k] + 1}, expected {N_COLS}",
                        path=str(path), line=line0 + int(k))
    return line0 + np.flatnonzero(~blank)


def _parse_block(block: bytes, lines: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """``(labels (n,), dense (n, 13) float32, categorical strings (n, 26) frame)`` of one block."""
    try:
        df = pd.read_csv(io.BytesIO(block), sep="\t", header=None, names=range(N_COLS), dtype=_DTYPES,
                         keep_default_na=False, na_values=_NUMERIC_NA, quoting=csv.QUOTE_NONE, engine="c")
    except ValueError as e:  # a non-numeric label / integer field: find the line to name it
        _raise_bad_number(block, lines, path, e)
    if len(df) != len(lines):
        raise DataError(f"parsed {len(df)} rows from {len(lines)} lines", path=str(path), line=int(lines[0]))
    labels = df[0].to_numpy()
    bad = np.flatnonzero((labels != 0) & (labels != 1))  # NaN is also bad
    if len(bad):
        k = bad[0]
        raise DataError(f"label must be 0 or 1, got {df[0].iloc[k].item()!r}", path=str(path), line=int(lines[k]))
    ints = df[list(range(1, 1 + N_INT))].to_numpy(np.float64)
    inf = np.argwhere(np.isinf(ints))  # "inf", "-Infinity", "1e400": parsed, but no count is infinite
    if len(inf):
        k, j = (int(v) for v in inf[0])
        raise DataError(f"column {j + 2} ({INT_NAMES[j]}): {float(ints[k, j])!r} is not a finite number",
                        path=str(path), line=int(lines[k]))
    dense = np.log1p(np.maximum(np.nan_to_num(ints, nan=0.0), 0.0)).astype(np.float32)
    return labels.astype(np.float32), dense, df[list(range(1 + N_INT, N_COLS))]


def _raise_bad_number(block: bytes, lines: np.ndarray, path: Path, err: Exception) -> None:
    """Per-line fallback, only for a block pandas rejected: name the first non-numeric field."""
    non_blank = [ln for ln in block.split(b"\n") if ln.strip(b"\r")]
    for line_no, raw in zip(lines, non_blank):
        fields = raw.rstrip(b"\r").split(b"\t")
        for j, field in enumerate(fields[: 1 + N_INT]):
            if field:
                try:
                    value: float | None = float(field)
                except ValueError:
                    value = None
                if value is None or not math.isfinite(value):  # "nan" is not missing here: missing is empty
                    col = "label" if j == 0 else INT_NAMES[j - 1]
                    what = "a number" if value is None else "a finite number"
                    raise DataError(f"column {j + 1} ({col}): {field.decode(errors='replace')!r} is not {what}",
                                    path=str(path), line=int(line_no))
    raise DataError(f"could not parse: {err}", path=str(path), line=int(lines[0]) if len(lines) else None)


def _cat_ids(cats: pd.DataFrame, vocab_size: int, vocabs: list[Vocab] | None) -> np.ndarray:
    """Ids ``(n, 26)`` of the categorical strings: hashed buckets, or the counted vocabularies."""
    ids = np.empty((len(cats), N_CAT), dtype=np.int64)
    for j in range(N_CAT):
        h = hash_strings(cats.iloc[:, j].to_numpy(), salt=j + 1)
        col = vocabs[j].lookup(h) if vocabs is not None else buckets(h, vocab_size)
        ids[:, j] = np.where(h == hash_strings(_EMPTY, salt=j + 1)[0], 0, col)  # "" is missing
    return ids


def _first_pass(path: Path, chunk_bytes: int, fractions: Sequence[float], seed: int, min_count: int,
                vocab_size: int, progress: bool) -> tuple[dict[str, int], list[Vocab] | None]:
    """Rows per split, and with ``min_count`` the vocabularies counted on the train rows."""
    counts, row0 = np.zeros(3, np.int64), 0
    counters = [VocabCounter() for _ in range(N_CAT)] if min_count > 0 else None
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, disable=not progress, desc="criteo: count") as bar:
        for block, lines in _iter_blocks(path, chunk_bytes, bar):
            codes = request_splits(np.arange(row0, row0 + len(lines)), fractions, seed)
            counts += np.bincount(codes, minlength=3)
            row0 += len(lines)
            if counters is not None and len(lines):
                cats = _parse_block(block, lines, path)[2][codes == 0]
                for j, counter in enumerate(counters):
                    values = cats.iloc[:, j].to_numpy()
                    counter.update(hash_strings(values[values != ""], salt=j + 1))
    if row0 == 0:
        raise DataError("empty file: no data rows", path=str(path))
    vocabs = None if counters is None else [c.build(min_count, vocab_size) for c in counters]
    return dict(zip(SPLITS, counts.tolist())), vocabs


def _spec(vocab_sizes: Sequence[int], request_features: Sequence[str]) -> FeatureSpec:
    unknown = sorted(set(request_features) - set(INT_NAMES) - set(CAT_NAMES))
    if unknown:
        raise ValueError(f"request_features: unknown Criteo columns {unknown} (known: I1..I13, C1..C26)")
    side = lambda name: "request" if name in request_features else "candidate"  # noqa: E731
    return FeatureSpec(
        dense=tuple(DenseFeature(n, side(n)) for n in INT_NAMES),
        sparse=tuple(SparseFeature(n, int(v), side(n)) for n, v in zip(CAT_NAMES, vocab_sizes)),
        name="criteo",
    )


def read_criteo(
    path: str | Path, out_dir: str | Path | None = None, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_count: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS, split_seed: int = 0,
    request_features: Sequence[str] = (), progress: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    cache_dir: str | Path | None = None,
) -> ClickData:
    """Read a raw Criteo TSV into a data directory (cached; see the module docstring).

    ``out_dir`` defaults to ``<cache root>/criteo-<file stem>-<key>`` (see
    :func:`rankitect.data.store.data_cache_root`; ``cache_dir`` overrides the root).
    Bad input raises :class:`~rankitect.errors.DataError` naming the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError("no such file", path=str(p))
    if not isinstance(vocab_size, int) or vocab_size < 3:
        raise ValueError(f"vocab_size must be an int >= 3, got {vocab_size!r}")
    if min_count < 0 or chunk_bytes < 1:
        raise ValueError(f"min_count must be >= 0 and chunk_bytes >= 1, got {min_count!r}, {chunk_bytes!r}")
    options = {"reader": READER_VERSION, "vocab_size": vocab_size, "min_count": min_count,
               "fractions": list(check_fractions(fractions)), "split_seed": split_seed,
               "request_features": sorted(request_features)}
    key = file_cache_key(p, options)
    out = Path(out_dir) if out_dir is not None else data_cache_root(cache_dir) / f"criteo-{p.stem}-{key}"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"source": "criteo", "name": "criteo", "path": str(p.resolve()), "params": options, "cache_key": key}
    return cached(out, key, lambda d: _build(p, d, meta, chunk_bytes, progress))


def _build(path: Path, out: Path, meta: dict[str, Any], chunk_bytes: int, progress: bool) -> ClickData:
    opt = meta["params"]
    fractions, seed, vocab_size = opt["fractions"], opt["split_seed"], opt["vocab_size"]
    rows, vocabs = _first_pass(path, chunk_bytes, fractions, seed, opt["min_count"], vocab_size, progress)
    sizes = [v.size for v in vocabs] if vocabs is not None else [vocab_size] * N_CAT
    spec = _spec(sizes, opt["request_features"])
    row0 = 0
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, disable=not progress, desc="criteo: parse")
    with StoreWriter(out, spec, rows) as w, bar:
        for block, lines in _iter_blocks(path, chunk_bytes, bar):
            labels, dense, cats = _parse_block(block, lines, path)
            ids = _cat_ids(cats, vocab_size, vocabs)
            request_ids = np.arange(row0, row0 + len(labels), dtype=np.int64)
            w.write_routed(request_splits(request_ids, fractions, seed), dense, ids, labels, request_ids)
            row0 += len(labels)
        return w.close(meta)
