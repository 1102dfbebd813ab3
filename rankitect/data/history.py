"""History (sequence) columns of a tabular file: the schema's ``history:`` entries, parsed into ids.

A history column holds, per row, the ids of the user's earlier items, oldest first and latest last:
in a CSV a string of integer ids joined by the entry's ``delimiter`` (default ``|``), in parquet a
list column of integers. Schema entries::

    history:
      - name: clicks              # the column
        max_len: 20               # ids a model reads: the latest 20 (a longer history is truncated)
        delimiter: "|"            # CSV only (default "|"); tokens are stripped, empty ones skipped
        shares: item              # optional: a sparse column whose vocabulary (and, in a model,
                                  # embedding table) the history uses

An empty or missing cell is a history of length 0. A history longer than ``max_len`` keeps its
latest ``max_len`` ids. Errors name the file, the line (CSV) or row (parquet) and the column: a
token that is not an integer, or a raw history of more than :func:`raw_bound` ids (far beyond any
``max_len``: truncation handles ordinary long histories, the bound catches a corrupt field, such
as columns run together). A ``shares`` naming no sparse column names the schema file and the line
of the key.

Ids: a shared history's tokens go through the shared column's vocabulary exactly as that column's
values do (the same salted hash, then its ``vocab: train`` table or its hash buckets), so the same
item has the same id in both. A history without ``shares`` gets a vocabulary of its own, by the
schema's ``vocab`` rule: counted over the train split's tokens (``vocab: train``, kept as
``vocab/<column>.npy``) or hash buckets (``vocab: hash``); its salt follows the sparse columns'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rankitect.data.hashing import buckets, hash_strings
from rankitect.data.vocab import Vocab, VocabCounter
from rankitect.errors import DataError

ENTRY_KEYS = ("name", "max_len", "delimiter", "shares")
DEFAULT_DELIMITER = "|"
RAW_BOUND_FLOOR, RAW_BOUND_FACTOR = 1000, 100
Where = Callable[[int], dict[str, Any]]


def raw_bound(max_len: int) -> int:
    """The most ids a row's raw history may hold: ``max(1000, 100 * max_len)``.

    >>> raw_bound(20), raw_bound(50)
    (2000, 5000)
    """
    return max(RAW_BOUND_FLOOR, RAW_BOUND_FACTOR * max_len)


def check_history(s: dict[str, Any], sp: Path) -> list[dict[str, Any]]:
    """The schema's ``history`` entries checked (see the module docstring), with their defaults."""
    raw = s.get("history") or []
    if not isinstance(raw, list):
        raise DataError(f"history: must be a list of {{name, max_len, delimiter, shares}} entries, got {raw!r}",
                        path=str(sp))
    entries, taken = [], [s["label"], *s["dense"], *s["sparse"]]
    for k, e in enumerate(raw):
        where = f"history[{k}]"
        if not isinstance(e, dict) or set(map(str, e)) - set(ENTRY_KEYS) or "name" not in e or "max_len" not in e:
            raise DataError(f"{where}: must be a mapping with name and max_len (keys: {', '.join(ENTRY_KEYS)}), "
                            f"got {e!r}", path=str(sp))
        name, max_len = e["name"], e["max_len"]
        if not isinstance(name, str) or not name.isidentifier() or name in taken:
            raise DataError(f"{where}.name: must be a column name not listed elsewhere, got {name!r}", path=str(sp))
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise DataError(f"{where}.max_len: must be an int >= 1, got {max_len!r}", path=str(sp))
        delimiter = e.get("delimiter", DEFAULT_DELIMITER)
        if not isinstance(delimiter, str) or not delimiter:
            raise DataError(f"{where}.delimiter: must be a non-empty string, got {delimiter!r}", path=str(sp))
        shares = e.get("shares")
        if shares is not None and shares not in s["sparse"]:
            raise DataError(f"{where}.shares: {shares!r} is no sparse column (sparse: {s['sparse']})",
                            path=str(sp), line=_key_line(sp, k, "shares"))
        taken.append(name)
        entries.append({"name": name, "max_len": max_len, "delimiter": delimiter, "shares": shares})
    return entries


def _key_line(sp: Path, k: int, key: str) -> int | None:
    """The 1-based line of ``history[k].<key>``'s value in the schema file (``None`` if not found)."""
    try:
        root = yaml.compose(sp.read_text())
    except yaml.YAMLError:
        return None
    node = _child(root, "history")
    if not isinstance(node, yaml.SequenceNode) or k >= len(node.value):
        return None
    value = _child(node.value[k], key)
    return None if value is None else value.start_mark.line + 1


def _child(node: Any, key: str) -> Any:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for kn, v in node.value if getattr(kn, "value", None) == key), None)


def _is_int(token: str) -> bool:
    body = token[1:] if token[:1] in "+-" else token
    return body.isascii() and body.isdigit()


def _cell_tokens(cell: Any, delimiter: str) -> list[str] | None:
    """A cell's tokens (strings), or ``None`` when one is not an integer."""
    if cell is None or (isinstance(cell, float) and cell != cell):
        return []
    if isinstance(cell, str):
        tokens = [t.strip() for t in cell.split(delimiter)]
        tokens = [t for t in tokens if t]
        return tokens if all(_is_int(t) for t in tokens) else None
    out = []
    for v in cell:  # a parquet list cell
        if isinstance(v, (bool, np.bool_)):
            return None
        if isinstance(v, (int, np.integer)):
            out.append(str(int(v)))
        elif isinstance(v, (float, np.floating)) and float(v).is_integer():
            out.append(str(int(v)))
        elif isinstance(v, str) and _is_int(v.strip()):
            out.append(v.strip())
        else:
            return None
    return out


def parse_tokens(values: Sequence[Any], entry: dict[str, Any], where: Where) -> tuple[list[str], np.ndarray]:
    """The kept tokens of every row (row after row, each row's latest ``max_len``, oldest first)
    and each row's count ``(n,)``; a bad cell is a :class:`DataError` at ``where(row)``."""
    name, max_len, bound = entry["name"], entry["max_len"], raw_bound(entry["max_len"])
    flat: list[str] = []
    lengths = np.zeros(len(values), dtype=np.int64)
    for row, cell in enumerate(values):
        tokens = _cell_tokens(cell, entry["delimiter"])
        if tokens is None:
            raise DataError(f"history column {name!r}: {_shown(cell)!r} holds an id that is not an integer "
                            f"(ids joined by {entry['delimiter']!r})", **where(row))
        if len(tokens) > bound:
            raise DataError(f"history column {name!r}: {len(tokens)} ids, more than the {bound} any row may hold "
                            f"(max_len {max_len} keeps the latest {max_len}; this many means a corrupt field)",
                            **where(row))
        kept = tokens[-max_len:]
        flat.extend(kept)
        lengths[row] = len(kept)
    return flat, lengths


def _shown(cell: Any) -> Any:
    text = cell if isinstance(cell, str) else str(list(cell))
    return text if len(text) <= 80 else text[:77] + "..."


def right_aligned(ids: np.ndarray, lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Flat ids (row after row) placed right-aligned in ``(n, max_len)`` (pads of 0 first).

    >>> right_aligned(np.array([5, 6, 7]), np.array([2, 0, 1]), 3).tolist()
    [[0, 5, 6], [0, 0, 0], [0, 0, 7]]
    """
    out = np.zeros((len(lengths), max_len), dtype=np.int64)
    mask = np.arange(max_len) >= (max_len - lengths)[:, None]  # row-major order: each row's ids in turn
    out[mask] = ids
    return out


def history_ids(
    tokens: list[str], lengths: np.ndarray, entry: dict[str, Any], s: dict[str, Any], *, salt: int,
    shared_vocab: np.ndarray | None, train: np.ndarray, vocabs: dict[str, np.ndarray],
) -> tuple[np.ndarray, int]:
    """Right-aligned ids ``(n, max_len)`` of a history and its vocabulary size.

    ``salt``: the shared column's (for ``shares``) or the history's own; ``shared_vocab``: the
    shared column's kept hashes in id order (``vocab: train``), else ``None``; ``train`` ``(n,)``
    marks train rows (an own ``vocab: train`` vocabulary counts their tokens, and is kept in
    ``vocabs``)."""
    h = hash_strings(np.asarray(tokens, dtype=object), salt=salt) if tokens else np.zeros(0, np.uint64)
    if s["vocab"] == "hash":
        ids, size = buckets(h, s["vocab_size"]), s["vocab_size"]
    elif shared_vocab is not None:
        vocab = Vocab(shared_vocab)
        ids, size = vocab.lookup(h), vocab.size
    else:
        counter = VocabCounter()
        counter.update(h[np.repeat(train, lengths)])
        vocab = counter.build(s["min_count"], s["vocab_size"])
        ids, size = vocab.lookup(h), vocab.size
        vocabs[entry["name"]] = vocab.sorted[np.argsort(vocab.ids, kind="stable")]
    return right_aligned(ids, lengths, entry["max_len"]), int(size)


def check_constant(order: np.ndarray, rid: np.ndarray, ids: np.ndarray, name: str, request_id: str,
                   where: Where) -> None:
    """A history is request side: every row of a request (rows ``order``, grouped) holds the same one."""
    rows = np.ascontiguousarray(ids).view(np.dtype((np.void, ids.dtype.itemsize * ids.shape[1]))).ravel()
    r = rid[order]
    first = np.concatenate([[True], r[1:] != r[:-1]])
    head = order[np.maximum.accumulate(np.where(first, np.arange(len(r)), 0))]
    bad = np.flatnonzero(rows[order] != rows[head])
    if len(bad):
        raise DataError(f"history column {name!r} changes within a request (rows sharing {request_id!r}); a history "
                        "is the user's, the same for every candidate of a request", **where(int(order[bad[0]])))
