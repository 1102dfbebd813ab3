"""The feature preprocessing of a data set, written beside an export as ``preprocess.json``.

It tells the exported ``model.py`` (:class:`~rankitect.export.bundled_runtime.RowScorer`) how a
raw row becomes the model's inputs, with the readers' own rules:

* tabular (CSV / parquet): dense missing -> 0, then ``sign(x) log(1 + |x|)`` (the schema's
  ``dense_transform: log1p``, the default) or as given (``none``); a categorical value is the string the
  reader reads, hashed with SipHash-2-4 keyed per column (``rankitect.data.hashing.hash_strings``),
  then either bucketed (``vocab: hash``) or looked up in the vocabulary counted on the train split
  (``vocab: train``; unseen or rare values get the OOV id 1), missing -> 0;
* Criteo TSV: dense ``log(1 + max(x, 0))``, categoricals hashed into buckets, empty -> 0;
* synthetic, and any data directory written directly (``StoreWriter``): rows hold the model's
  inputs already, dense values as stored and ids; an id outside a table maps to the OOV id 1.

A data set with history columns adds ``history``: per sequence feature its ``max_len``, the
``delimiter`` of its raw string (the schema's, ``|`` for a generated set), the ``bound`` on a raw
history's ids (:func:`rankitect.data.history.raw_bound`) and ``ids``: how a token becomes an id,
an entry like a sparse column's (a shared history's is the shared column's, with the same key, so an
item gets the candidate column's id).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankitect.data.clickdata import ClickData, load_array
from rankitect.data.history import DEFAULT_DELIMITER, raw_bound
from rankitect.errors import DataError

FORMAT = 1
OOV_ID = 1


def _key(salt: int) -> str:
    """The 16-character SipHash key of ``hash_strings(..., salt)``."""
    return f"{salt % 10**16:016d}"


def preprocessing(data: ClickData) -> dict[str, Any]:
    """The preprocessing of ``data`` as plain JSON data (see the module docstring)."""
    spec, source, params = data.spec, data.source, data.meta.get("params", {})
    if source == "tabular":
        transform = "signed_log1p" if params.get("dense_transform", "none") == "log1p" else "none"
        dense = [{"name": f.name, "transform": transform} for f in spec.dense]
        sparse = [_tabular_sparse(data, params, j, f) for j, f in enumerate(spec.sparse)]
    elif source == "criteo":
        if params.get("min_count"):
            raise DataError("export: Criteo vocabularies counted with min_count are not kept; "
                            "export a model trained on hashed ids (min_count 0)", path=str(data.path))
        dense = [{"name": f.name, "transform": "log1p"} for f in spec.dense]
        sparse = [{"name": f.name, "encoding": "hash", "key": _key(j + 1), "buckets": f.vocab_size}
                  for j, f in enumerate(spec.sparse)]
    else:  # synthetic, or a store written directly: its rows are the model's inputs
        dense = [{"name": f.name, "transform": "none"} for f in spec.dense]
        sparse = [{"name": f.name, "encoding": "id", "size": f.vocab_size} for f in spec.sparse]
    out = {"format": FORMAT, "source": source, "label": spec.label, "oov_id": OOV_ID, "dense": dense,
           "sparse": sparse}
    if spec.sequence:  # only then: the preprocessing of data without history stays as it was
        out["history"] = _history(data, params, sparse)
    return out


def _history(data: ClickData, params: dict[str, Any], sparse: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sequence feature's raw form and its token -> id rule (see the module docstring)."""
    spec, out = data.spec, []
    entries = {e["name"]: e for e in params.get("history", [])} if data.source == "tabular" else {}
    names = [f.name for f in spec.sparse]
    for k, f in enumerate(spec.sequence):
        if f.shares is not None:
            ids = {key: v for key, v in sparse[names.index(f.shares)].items() if key != "hashes"}
        elif data.source == "tabular":
            ids = _tabular_sparse(data, params, len(names) + k, f)
        else:
            ids = {"name": f.name, "encoding": "id", "size": f.vocab_size}
        delimiter = entries.get(f.name, {}).get("delimiter", DEFAULT_DELIMITER)
        out.append({"name": f.name, "max_len": f.max_len, "delimiter": delimiter, "bound": raw_bound(f.max_len),
                    "ids": ids})
    return out


def _tabular_sparse(data: ClickData, params: dict[str, Any], j: int, feature: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": feature.name, "key": _key(j + 1)}
    if params.get("vocab") == "hash":
        return entry | {"encoding": "hash", "buckets": feature.vocab_size}
    path = Path(data.path) / "vocab" / f"{feature.name}.npy"
    if not path.is_file():
        raise DataError(f"export: the vocabulary of column {feature.name!r} was not kept (a cache written by an "
                        "older rankitect: delete it to rebuild)", path=str(data.path))
    hashes = load_array(path, mmap=False)  # a pickled .npy is refused, never unpickled
    return entry | {"encoding": "vocab", "hashes": [int(h) for h in hashes]}  # id of hashes[i] is i + 2
