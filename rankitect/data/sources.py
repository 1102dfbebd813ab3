"""One opener for every source, and a plain description of a data set.

``open_data(source)`` understands:

* ``"synthetic"`` (the default): the embedded generator, cached (:func:`ensure_default_data`);
* ``"synthetic-categorical"``: an all-categorical click log (Zipf users and items, no dense
  features), cached (:func:`~rankitect.data.synthetic_categorical.ensure_categorical_data`);
* an existing data directory (one with ``meta.json``): opened as is;
* a ``.tsv`` / ``.txt`` file: raw Criteo (:func:`~rankitect.data.criteo.read_criteo`);
* a ``.csv`` / ``.parquet`` / ``.pq`` file: tabular with a schema YAML
  (:func:`~rankitect.data.tabular.read_tabular`); without ``schema=``, ``<file>.schema.yaml``
  or ``<file stem>.schema.yaml`` next to the file is used when it exists.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

from rankitect.data.hashing import SPLITS
from rankitect.data.clickdata import ClickData, is_data_dir
from rankitect.errors import DataError

_CRITEO_SUFFIXES = (".tsv", ".txt")
GENERATED = ("synthetic", "synthetic-categorical")  # sources drawn by a seeded generator, by name
_TABULAR_SUFFIXES = (".csv", ".parquet", ".pq")


class DataOptions(Protocol):
    """What :func:`open_data` reads from a config object (e.g. the CLI's ``DataConfig``)."""

    rows: int | None
    seed: int
    ctr: float | None
    history: int
    schema: str | None
    vocab_size: int
    cache_dir: str | None


# Splits a model cannot be trained or selected without (the test split only scores it).
NEEDED_SPLITS = ("train", "val")


def open_data(
    source: str = "synthetic", options: DataOptions | None = None, *, rows: int | None = None,
    seed: int | None = None, ctr: float | None = None, schema: str | Path | None = None, vocab_size: int | None = None,
    cache_dir: str | Path | None = None, progress: bool = False, history: int | None = None,
) -> ClickData:
    """Open (building and caching on first use) the data set named by ``source``.

    Keyword arguments win over ``options``; ``rows``, ``seed`` and ``ctr`` (the mean click rate)
    apply to the generated sets (:data:`GENERATED`) only (``None``: each generator's own default),
    ``schema`` to tabular files, ``vocab_size`` to Criteo files (a tabular file takes its own from
    the schema), ``history`` (the longest history of a request, 0: none) to ``synthetic-categorical``
    only. ``cache_dir`` is the cache root (default: ``$RANKITECT_DATA_DIR`` or
    ``~/.cache/rankitect/data``).

    A data set whose train or validation split is empty is refused (a :class:`DataError` naming
    the source and the size of each split): nothing could be trained or selected on it. So is one
    whose train labels are all one value; val or test labels of one value are warned about
    (:func:`require_labels`).
    """
    data = _open(source, options, rows=rows, seed=seed, ctr=ctr, schema=schema, vocab_size=vocab_size, cache_dir=cache_dir,
                 progress=progress, history=history)
    return require_labels(require_splits(data, source), source)


def require_splits(data: ClickData, source: str | Path) -> ClickData:
    """``data`` if each of :data:`NEEDED_SPLITS` holds rows; else a :class:`DataError`."""
    sizes = {name: len(data.split(name)) for name in SPLITS}
    empty = [name for name in NEEDED_SPLITS if sizes[name] == 0]
    if empty:
        counts = ", ".join(f"{k} {v}" for k, v in sizes.items())
        raise DataError(f"the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty ({counts} "
                        "rows; rows go to a split by a hash of their request id): more rows or more distinct "
                        "request ids are needed", path=str(source))
    return data


def require_labels(data: ClickData, source: str | Path) -> ClickData:
    """``data`` if its train split holds both labels; else a :class:`DataError` (a model learns
    nothing from one label, and NE, whose unit is the label entropy, is undefined). A val or test
    split with one label is only warned about: its NE and logloss still score, its AUC is undefined."""
    for name in SPLITS:
        stats = data.meta["splits"][name]
        rows, positives = int(stats["rows"]), int(stats["positives"])
        if rows == 0 or 0 < positives < rows:
            continue
        what = f"every label of the {name} split is {0 if positives == 0 else 1} ({rows} rows)"
        if name == "train":
            raise DataError(f"{what}: a model learns nothing from one label value and NE is undefined; the label "
                            "column needs both 0s and 1s", path=str(source))
        warnings.warn(f"{source}: {what}: its AUC is undefined (NE still scores)", stacklevel=2)
    return data


def _open(
    source: str, options: DataOptions | None, *, rows: int | None, seed: int | None, ctr: float | None,
    schema: str | Path | None,
    vocab_size: int | None, cache_dir: str | Path | None, progress: bool, history: int | None = None,
) -> ClickData:
    pick = lambda given, name: given if given is not None else getattr(options, name, None)  # noqa: E731
    rows, seed, schema = pick(rows, "rows"), pick(seed, "seed"), pick(schema, "schema")
    ctr, history = pick(ctr, "ctr"), pick(history, "history") or 0
    if history and source != "synthetic-categorical":
        raise DataError(f"data.history={history} applies to the synthetic-categorical source only (a file names its "
                        "history columns in its schema)", path=str(source))
    vocab_size, cache_dir = pick(vocab_size, "vocab_size"), pick(cache_dir, "cache_dir")
    if source == "synthetic":
        from rankitect.data.synthetic import DEFAULT_ROWS, TARGET_CTR, ensure_default_data

        return ensure_default_data(rows=DEFAULT_ROWS if rows is None else rows, seed=seed or 0, cache_dir=cache_dir,
                                   progress=progress, ctr=TARGET_CTR if ctr is None else ctr)
    if source == "synthetic-categorical":
        from rankitect.data.synthetic_categorical import DEFAULT_ROWS as CATEGORICAL_ROWS
        from rankitect.data.synthetic_categorical import TARGET_CTR as CATEGORICAL_CTR
        from rankitect.data.synthetic_categorical import ensure_categorical_data

        return ensure_categorical_data(rows=CATEGORICAL_ROWS if rows is None else rows, seed=seed or 0,
                                       cache_dir=cache_dir, progress=progress,
                                       ctr=CATEGORICAL_CTR if ctr is None else ctr, history=history)
    path = Path(source).expanduser()
    if path.is_dir():
        if not is_data_dir(path):
            raise DataError("a directory, but not a rankitect data directory (no meta.json)", path=str(path))
        return ClickData.open(path)
    if not path.exists():
        raise DataError(f"no such file or directory (expected one of {list(GENERATED)}, a Criteo .tsv, a .csv/.parquet "
                        "or a data directory)", path=str(path))
    suffix = path.suffix.lower()
    if suffix in _CRITEO_SUFFIXES:
        from rankitect.data.criteo import DEFAULT_VOCAB_SIZE, read_criteo

        return read_criteo(path, vocab_size=vocab_size or DEFAULT_VOCAB_SIZE, progress=progress, cache_dir=cache_dir)
    if suffix in _TABULAR_SUFFIXES:
        from rankitect.data.tabular import read_tabular

        return read_tabular(path, _schema_for(path, schema), cache_dir=cache_dir)
    raise DataError(f"unknown data format {suffix!r}: expected {_CRITEO_SUFFIXES + _TABULAR_SUFFIXES} "
                    "or a data directory", path=str(path))


def _schema_for(path: Path, schema: str | Path | None) -> Path:
    if schema is not None:
        return Path(schema).expanduser()
    for cand in (path.with_name(path.name + ".schema.yaml"), path.with_name(path.stem + ".schema.yaml")):
        if cand.is_file():
            return cand
    raise DataError(f"a tabular file needs a schema YAML: pass schema=... or put {path.stem}.schema.yaml "
                    "next to it", path=str(path))


def describe(data: ClickData) -> dict[str, Any]:
    """A plain summary for ``rankitect data inspect``: splits (rows, requests, CTR, Bayes NE)
    and features (kind, side, vocab size).

    >>> import tempfile
    >>> from rankitect.data.synthetic import generate_synthetic
    >>> d = describe(generate_synthetic(tempfile.mkdtemp() + "/s", rows=500))
    >>> sorted(d["splits"]), d["n_dense"], d["n_sparse"], d["features"][0]["side"]
    (['test', 'train', 'val'], 13, 26, 'request')
    """
    splits = {s: {k: data.meta["splits"][s][k] for k in ("rows", "requests", "ctr", "bayes_ne")} for s in SPLITS}
    feats = [{"name": f.name, "kind": "dense", "side": f.side, "vocab_size": None} for f in data.spec.dense]
    feats += [{"name": f.name, "kind": "sparse", "side": f.side, "vocab_size": f.vocab_size} for f in data.spec.sparse]
    feats += [{"name": f.name, "kind": "history", "side": f.side, "vocab_size": f.vocab_size, "max_len": f.max_len,
               "shares": f.shares} for f in data.spec.sequence]
    return {
        "name": data.meta.get("name", data.spec.name), "source": data.source, "path": str(data.path),
        "rows": sum(v["rows"] for v in splits.values()), "splits": splits,
        "n_dense": data.spec.n_dense, "n_sparse": data.spec.n_sparse, "label": data.spec.label,
        "features": feats, "params": data.meta.get("params", {}),
    }
