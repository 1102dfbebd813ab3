"""The tabular reader: a CSV (with a header line) or parquet file plus a small schema YAML.

Schema keys (anything else is an error naming the schema file and the key)::

    label: clicked                # required: a 0/1 (or boolean) column
    dense: [price, age]           # real-valued columns; missing (empty, NA, nan) -> 0; inf is an error
    dense_transform: log1p        # "log1p" (default): sign(x) * log(1 + |x|); "none": as read
    sparse: [user, item, city]    # categorical columns (strings or ints)
    request: [user, city]         # which of the above are request side (default: none)
    request_id: session           # optional: rows sharing it form one request
    vocab: train                  # "train" (default) or "hash", see below
    vocab_size: 100000            # cap on ids per sparse column (default 100 000)
    min_count: 1                  # "train" vocabularies keep values seen this often (default 1)
    fractions: [0.8, 0.1, 0.1]    # train / val / test (default 80/10/10)
    split_seed: 0
    name: mydata                  # default: the data file's stem
    history:                      # history (sequence) columns, see rankitect.data.history
      - {name: clicks, max_len: 20, delimiter: "|", shares: item}

Sparse values are read as strings (an int ``7`` is the string ``"7"``). With ``vocab: train`` each
column's vocabulary is built on the *train* split only: values seen ``>= min_count`` times get ids
``2 ..`` (most frequent first, at most ``vocab_size - 2``), everything else (rare, or only in
val/test) gets id 1, missing gets 0. With ``vocab: hash`` a value's id is its salted SipHash
bucket in ``1 .. vocab_size - 1`` (the Criteo reader's rule): no pass over the data needed.

Requests: with ``request_id`` the rows of one request are gathered (order of first appearance,
rows kept in file order) and stored request ids are those first-appearance numbers; a request's
split is chosen by the hash of its ``request_id`` value. Request-side columns must be constant
within a request. Without ``request_id`` every row is its own request.

Every CSV line must have as many fields as the header (a ragged line is an error naming it), and
every dense and label value must be a finite number where it is not missing (``inf``, ``-inf`` or
``1e400`` is an error naming the line and column).

The file is read whole into one pandas frame (arrays are then streamed to disk in chunks); the
result is cached under a key of the file (path, size, mtime) and the schema's text. With
``vocab: train`` each column's kept value hashes are saved as ``vocab/<column>.npy`` (uint64, id
order: the first has id 2), so an export can map raw values to the same ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from rankitect.data.hashing import DEFAULT_FRACTIONS, SPLITS, buckets, check_fractions, hash_strings, split_codes
from rankitect.data.hashing import request_splits
from rankitect.data.history import check_constant, check_history, history_ids, parse_tokens
from rankitect.data.spec import DenseFeature, FeatureSpec, SequenceFeature, SparseFeature
from rankitect.data.clickdata import ClickData
from rankitect.data.store import StoreWriter, cached, data_cache_root, file_cache_key
from rankitect.data.vocab import VocabCounter
from rankitect.errors import DataError

READER_VERSION = 3  # 2: dense columns log1p-transformed by default; 3: vocabularies saved beside the arrays
SCHEMA_KEYS = ("label", "dense", "dense_transform", "sparse", "request", "request_id", "vocab", "vocab_size",
               "min_count", "fractions", "split_seed", "name", "history")
DENSE_TRANSFORMS = ("log1p", "none")
_WRITE_CHUNK = 65536


def load_schema(schema_path: str | Path, data_path: str | Path) -> dict[str, Any]:
    """Read and check a schema YAML (see the module docstring); errors name the schema and key."""
    sp = Path(schema_path)
    if not sp.is_file():
        raise DataError("no such schema file", path=str(sp))
    try:
        raw = yaml.safe_load(sp.read_text())
    except yaml.YAMLError as e:
        raise DataError(f"not valid YAML: {e}", path=str(sp)) from None
    if not isinstance(raw, dict):
        raise DataError(f"a schema must be a mapping of keys {SCHEMA_KEYS}, got {type(raw).__name__}", path=str(sp))
    unknown = sorted(set(map(str, raw)) - set(SCHEMA_KEYS))
    if unknown:
        raise DataError(f"unknown schema key {unknown[0]!r} (known: {', '.join(SCHEMA_KEYS)})", path=str(sp))
    s = {"dense": [], "dense_transform": "log1p", "sparse": [], "request": [], "request_id": None, "vocab": "train",
         "vocab_size": 100_000,
         "min_count": 1, "fractions": list(DEFAULT_FRACTIONS), "split_seed": 0, "name": Path(data_path).stem, **raw}
    _check_types(s, sp)
    s["history"] = check_history(s, sp)
    return s


def _check_types(s: dict[str, Any], sp: Path) -> None:
    def bad(key: str, why: str) -> DataError:
        return DataError(f"{key}: {why}, got {s.get(key)!r}", path=str(sp))

    if not isinstance(s.get("label"), str):
        raise bad("label", "the label column name is required")
    if s["dense_transform"] not in DENSE_TRANSFORMS:
        raise bad("dense_transform", f"must be one of {list(DENSE_TRANSFORMS)}")
    for key in ("dense", "sparse", "request"):
        if not isinstance(s[key], list) or not all(isinstance(c, str) for c in s[key]):
            raise bad(key, "must be a list of column names")
    if s["request_id"] is not None and not isinstance(s["request_id"], str):
        raise bad("request_id", "must be a column name")
    if s["vocab"] not in ("train", "hash"):
        raise bad("vocab", "must be 'train' or 'hash'")
    for key, lo in (("vocab_size", 3), ("min_count", 1), ("split_seed", 0)):
        if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < lo:
            raise bad(key, f"must be an int >= {lo}")
    try:
        s["fractions"] = list(check_fractions(s["fractions"]))
    except (TypeError, ValueError):
        raise bad("fractions", "must be 3 numbers summing to 1") from None
    names = [s["label"], *s["dense"], *s["sparse"]]
    for key in ("label", "dense", "sparse"):
        for c in [s[key]] if key == "label" else s[key]:
            if names.count(c) > 1:
                raise bad(key, f"column {c!r} is listed twice")
            if not c.isidentifier():
                raise bad(key, f"column {c!r} is not an identifier (rename it in the file)")
    extra = sorted(set(s["request"]) - set(s["dense"]) - set(s["sparse"]))
    if extra:
        raise bad("request", f"columns {extra} are in neither dense nor sparse")


def _read_frame(path: Path, s: dict[str, Any], schema_path: Path) -> pd.DataFrame:
    """The needed columns of the file (sparse and request id as strings); errors name the key."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            present = set(pq.read_schema(path).names)
        else:
            present = set(pd.read_csv(path, nrows=0).columns)
            check_field_counts(path)
        history = [e["name"] for e in s.get("history", [])]
        for key in ("label", "dense", "sparse", "request_id", "history"):
            columns = history if key == "history" else [s[key]] if isinstance(s[key], str) else (s[key] or [])
            for c in columns:
                if c not in present:
                    raise DataError(f"{key}: column {c!r} not in {path} (columns: {sorted(present)})",
                                    path=str(schema_path))
        rid = [s["request_id"]] if s["request_id"] else []
        cols = list(dict.fromkeys([s["label"], *s["dense"], *s["sparse"], *rid, *history]))
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path, columns=cols)
        strings = {c: str for c in [*s["sparse"], s["request_id"], *history] if c}
        return pd.read_csv(path, usecols=cols, dtype=strings, keep_default_na=True)
    except DataError:
        raise
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise DataError(f"could not read: {e}", path=str(path)) from None


def check_field_counts(path: Path) -> None:
    """Every non-blank line of the CSV ``path`` holds as many fields as its header line; else a
    :class:`DataError` naming the first line that does not (pandas would pad a short line with
    missing values, and with ``usecols`` drop a long one's extra fields, without a word)."""
    raw = path.read_bytes()
    if b'"' in raw:  # quoted fields may hold commas and newlines: the csv module knows the rules
        _check_quoted_field_counts(path)
        return
    a = np.frombuffer(raw if raw.endswith(b"\n") else raw + b"\n", dtype=np.uint8)
    ends = np.flatnonzero(a == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    fields = np.diff(np.searchsorted(np.flatnonzero(a == 44), ends), prepend=0) + 1  # commas + 1, per line
    length = ends - starts
    cr = length > 0
    cr[cr] = a[ends[cr] - 1] == 13
    filled = np.flatnonzero(length - cr > 0)
    if len(filled) == 0:
        return
    expected = fields[filled[0]]
    bad = filled[fields[filled] != expected]
    if len(bad):
        k = int(bad[0])
        raise DataError(f"{fields[k]} fields, expected {expected} (as the header has)", path=str(path), line=k + 1)


def _check_quoted_field_counts(path: Path) -> None:
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        expected = None
        for row in reader:
            if not row:
                continue
            expected = len(row) if expected is None else expected
            if len(row) != expected:
                raise DataError(f"{len(row)} fields, expected {expected} (as the header has)", path=str(path),
                                line=reader.line_num)


def _where(path: Path, row: int) -> dict[str, Any]:
    """Error location of 0-based data row ``row``: a CSV line (header is line 1) or a parquet row."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return {"path": f"{path} (row {row})"}
    return {"path": str(path), "line": row + 2}


def _numeric(df: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    """A column as float64 with NaN for missing; a non-numeric value is a DataError."""
    orig = df[col]
    num = pd.to_numeric(orig, errors="coerce").to_numpy(np.float64)
    bad = np.flatnonzero(np.isnan(num) & orig.notna().to_numpy())
    if len(bad):
        raise DataError(f"column {col!r}: {_plain(orig.iloc[bad[0]])!r} is not a number", **_where(path, int(bad[0])))
    bad = np.flatnonzero(np.isinf(num))  # "inf", "-inf", "1e400": no missing-value rule covers them
    if len(bad):
        raise DataError(f"column {col!r}: {_plain(orig.iloc[bad[0]])!r} is not a finite number",
                        **_where(path, int(bad[0])))
    return num


def _strings(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values as str objects, missing mask)`` of a categorical column."""
    series = df[col]
    missing = series.isna().to_numpy()
    if pd.api.types.is_float_dtype(series) and np.all(np.mod(series.to_numpy()[~missing], 1) == 0):
        series = series.astype("Int64")  # ints read as floats because of missing values: "3", not "3.0"
    values = series.astype(object).where(~missing, "").astype(str).to_numpy(dtype=object)
    return values, missing


def _requests(df: pd.DataFrame, s: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row order grouping requests, request id per row, split code per row)`` in file order."""
    n = len(df)
    if not s["request_id"]:
        rid = np.arange(n, dtype=np.int64)
        return rid, rid, request_splits(rid, s["fractions"], s["split_seed"])
    values, _ = _strings(df, s["request_id"])
    codes, uniques = pd.factorize(values, sort=False)  # request numbers in order of first appearance
    request_hash = hash_strings(np.asarray(uniques, dtype=object), salt=s["split_seed"])
    split_of_request = split_codes(request_hash, s["fractions"])
    return np.argsort(codes, kind="stable"), codes.astype(np.int64), split_of_request[codes]


def _sparse_ids(
    df: pd.DataFrame, s: dict[str, Any], train: np.ndarray, vocabs: dict[str, np.ndarray]
) -> tuple[np.ndarray, list[int]]:
    """Ids ``(n, n_sparse)`` and the vocabulary size of each sparse column; ``vocabs`` receives
    each counted vocabulary's kept hashes in id order."""
    ids = np.zeros((len(df), len(s["sparse"])), dtype=np.int64)
    sizes = []
    for j, col in enumerate(s["sparse"]):
        values, missing = _strings(df, col)
        h = hash_strings(values, salt=j + 1)
        if s["vocab"] == "hash":
            col_ids, size = buckets(h, s["vocab_size"]), s["vocab_size"]
        else:
            counter = VocabCounter()
            counter.update(h[train & ~missing])
            vocab = counter.build(s["min_count"], s["vocab_size"])
            col_ids, size = vocab.lookup(h), vocab.size
            vocabs[col] = vocab.sorted[np.argsort(vocab.ids, kind="stable")]
        ids[:, j] = np.where(missing, 0, col_ids)
        sizes.append(int(size))
    return ids, sizes


def _check_request_side(s: dict[str, Any], order: np.ndarray, rid: np.ndarray, columns: dict[str, np.ndarray],
                        path: Path) -> None:
    """Request-side columns must not change within a request (checked after ids are assigned)."""
    r = rid[order]
    first = np.concatenate([[True], r[1:] != r[:-1]])
    head = order[np.maximum.accumulate(np.where(first, np.arange(len(r)), 0))]  # first row of each row's request
    for col in s["request"]:
        v = columns[col]
        bad = np.flatnonzero(v[order] != v[head])
        if len(bad):
            row = int(order[bad[0]])
            raise DataError(f"column {col!r} is listed under 'request' but changes within a request "
                            f"(rows sharing {s['request_id']!r})", **_where(path, row))


def read_tabular(
    path: str | Path, schema_path: str | Path, out_dir: str | Path | None = None, *,
    cache_dir: str | Path | None = None,
) -> ClickData:
    """Read a CSV / parquet file described by a schema YAML into a cached data directory."""
    p, sp = Path(path), Path(schema_path)
    if not p.is_file():
        raise DataError("no such file", path=str(p))
    s = load_schema(sp, p)
    text_hash = hashlib.sha256(sp.read_bytes()).hexdigest()[:16]
    key = file_cache_key(p, {"reader": READER_VERSION, "schema": text_hash})
    out = Path(out_dir) if out_dir is not None else data_cache_root(cache_dir) / f"tabular-{p.stem}-{key}"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"source": "tabular", "name": s["name"], "path": str(p.resolve()), "schema": str(sp.resolve()),
            "params": s, "cache_key": key}
    return cached(out, key, lambda d: _build(p, sp, s, d, meta))


def dense_log1p(x: np.ndarray) -> np.ndarray:
    """``sign(x) * log(1 + |x|)``: the dense transform of ``dense_transform: log1p``.

    >>> dense_log1p(np.array([0.0, 1.0, -1.0, 99999.0])).round(3).tolist()
    [0.0, 0.693, -0.693, 11.513]
    """
    return np.sign(x) * np.log1p(np.abs(x))


def _build(p: Path, sp: Path, s: dict[str, Any], out: Path, meta: dict[str, Any]) -> ClickData:
    df = _read_frame(p, s, sp)
    if len(df) == 0:
        raise DataError("empty file: no data rows", path=str(p))
    labels = _numeric(df, s["label"], p)
    bad = np.flatnonzero((labels != 0) & (labels != 1))
    if len(bad):
        raise DataError(f"label {s['label']!r} must be 0 or 1, got {_plain(df[s['label']].iloc[bad[0]])!r}",
                        **_where(p, int(bad[0])))
    dense = np.zeros((len(df), len(s["dense"])))  # missing -> 0
    for j, c in enumerate(s["dense"]):
        dense[:, j] = np.nan_to_num(_numeric(df, c, p), nan=0.0)
    if s["dense_transform"] == "log1p":  # heavy-tailed counts and amounts (as the Criteo reader does)
        dense = dense_log1p(dense)
    order, rid, codes = _requests(df, s)
    vocabs: dict[str, np.ndarray] = {}
    ids, sizes = _sparse_ids(df, s, codes == 0, vocabs)
    columns = {c: dense[:, j] for j, c in enumerate(s["dense"])} | {c: ids[:, j] for j, c in enumerate(s["sparse"])}
    _check_request_side(s, order, rid, columns, p)
    histories, sequence = _histories(df, s, p, codes == 0, vocabs, sizes)
    for f in sequence:
        check_constant(order, rid, histories[f.name][0], f.name, s["request_id"] or "", lambda r: _where(p, r))
    side = lambda c: "request" if c in s["request"] else "candidate"  # noqa: E731
    spec = FeatureSpec(dense=tuple(DenseFeature(c, side(c)) for c in s["dense"]),
                       sparse=tuple(SparseFeature(c, n, side(c)) for c, n in zip(s["sparse"], sizes)),
                       label=s["label"], name=s["name"], sequence=sequence)
    rows = dict(zip(SPLITS, np.bincount(codes, minlength=3).tolist()))
    with StoreWriter(out, spec, rows) as w:
        for i in range(0, len(order), _WRITE_CHUNK):
            o = order[i:i + _WRITE_CHUNK]
            part = {name: (h[o], n[o]) for name, (h, n) in histories.items()} or None
            w.write_routed(codes[o], dense[o], ids[o], labels[o], rid[o], history=part)
        if vocabs:
            (w.tmp / "vocab").mkdir()
            for col, hashes in vocabs.items():
                np.save(w.tmp / "vocab" / f"{col}.npy", hashes)
        return w.close(meta)


def _histories(
    df: pd.DataFrame, s: dict[str, Any], p: Path, train: np.ndarray, vocabs: dict[str, np.ndarray], sizes: list[int],
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple[SequenceFeature, ...]]:
    """Each history column's right-aligned ids and lengths, and its :class:`SequenceFeature`
    (:mod:`rankitect.data.history`); ``vocabs`` receives the own vocabularies it counts."""
    out, features = {}, []
    for k, e in enumerate(s["history"]):
        tokens, lengths = parse_tokens(df[e["name"]].to_numpy(dtype=object), e, lambda r: _where(p, r))
        shared = s["sparse"].index(e["shares"]) if e["shares"] else None
        salt = shared + 1 if shared is not None else len(s["sparse"]) + 1 + k
        ids, size = history_ids(tokens, lengths, e, s, salt=salt, train=train, vocabs=vocabs,
                                shared_vocab=vocabs.get(e["shares"]) if e["shares"] else None)
        if shared is not None:
            size = sizes[shared]
        out[e["name"]] = (ids, lengths)
        features.append(SequenceFeature(e["name"], e["max_len"], size, shares=e["shares"]))
    return out, tuple(features)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (so messages show ``2.0``, not ``np.float64(2.0)``)."""
    return value.item() if hasattr(value, "item") else value
