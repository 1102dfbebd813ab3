"""What an exported ``model.py`` needs beside the blocks: embedding tables, weights reading, raw rows.

Bundled verbatim into every exported ``model.py`` (:mod:`rankitect.export.bundle`), so it imports
only ``json``, ``math`` and ``torch``. :class:`SparseEmbedding` looks ids up in one plain
``nn.Embedding`` per feature (the exported model needs no torchrec); :func:`read_safetensors`
reads the format's header and tensors without the safetensors package; :class:`RowScorer` applies ``preprocess.json`` (see
:mod:`rankitect.export.preprocess`): SipHash-2-4 of a categorical value with the column's key,
followed by pandas' 64-bit mix (what ``pandas.util.hash_array`` returns), then a bucket or a
vocabulary id; an unseen value gets the OOV id.
"""

import json
import math

import torch
from torch import nn

MASK64 = (1 << 64) - 1
SAFETENSORS_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


class SparseEmbedding(nn.Module):
    """One ``nn.Embedding`` per sparse feature, in field order: ids ``(B, n_sparse)`` -> ``(B, n_sparse, D)``.

    ``order[k]`` is the storage column of field ``k`` (request-side features first). Each row
    has one id per feature, so a table lookup equals rankitect's sum-pooled embedding bag.
    ``dims[k]`` is field ``k``'s table width (default ``dim``); ``projected`` maps a vocabulary
    group to its fields, whose rows one bias-free Linear of the group brings to ``dim``, as
    rankitect's embedding does.

    >>> emb = SparseEmbedding([3, 5], 2, order=[1, 0])  # field 0 is storage column 1
    >>> ids = torch.tensor([[4, 2]])  # storage order: feature 0 has id 4, feature 1 has id 2
    >>> torch.equal(emb(ids)[0, 0], emb.tables[0].weight[2]), tuple(emb(ids).shape)
    (True, (1, 2, 2))
    """

    def __init__(self, vocab_sizes: list[int], dim: int, order: list[int], dims: list[int] | None = None,
                 projected: dict[str, list[int]] | None = None) -> None:
        super().__init__()
        dims = list(dims) if dims is not None else [dim] * len(vocab_sizes)
        self.tables = nn.ModuleList(nn.Embedding(v, d) for v, d in zip(vocab_sizes, dims))
        self.projected = {g: list(fields) for g, fields in (projected or {}).items()}
        self.projections = nn.ModuleDict(
            {g: nn.Linear(dims[fields[0]], dim, bias=False) for g, fields in self.projected.items()}
        )
        self.register_buffer("order", torch.tensor(order, dtype=torch.long), persistent=False)

    def embed(self, field: int, ids: torch.Tensor) -> torch.Tensor:
        """Ids ``(B, L)`` looked up in field ``field``'s table and brought to ``dim``: ``(B, L, dim)``
        (a history sharing that field's table)."""
        rows = self.tables[field](ids)  # (B, L, d)
        for group, fields in self.projected.items():
            if field in fields:
                return self.projections[group](rows)  # (B, L, d) -> (B, L, dim)
        return rows

    def forward(self, sparse_ids: torch.Tensor) -> torch.Tensor:
        ids = sparse_ids.index_select(1, self.order)  # (B, n_sparse): storage order -> field order
        parts = [t(ids[:, k]) for k, t in enumerate(self.tables)]  # n x (B, d_k)
        for group, fields in self.projected.items():
            stacked = torch.stack([parts[k] for k in fields], dim=1)  # (B, n_g, d_g)
            out = self.projections[group](stacked)  # (B, n_g, d_g) @ (d_g, D) -> (B, n_g, D)
            for j, k in enumerate(fields):
                parts[k] = out[:, j]
        return torch.stack(parts, dim=1)  # n x (B, D) -> (B, n, D)


def read_safetensors(path: str) -> dict:
    """The tensors of a ``.safetensors`` file: 8-byte little-endian header size, JSON header, data."""
    with open(path, "rb") as f:
        blob = f.read()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size].decode("utf-8"))
    data = bytearray(blob[8 + size :])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        flat = torch.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=start)
        out[name] = flat.reshape(entry["shape"]).clone()
    return out


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK64


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple:
    v0 = (v0 + v1) & MASK64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & MASK64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & MASK64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & MASK64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 (Aumasson and Bernstein 2012) of ``data`` under the 16-byte ``key``."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    end = len(data) - len(data) % 8
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, end, 8)]
    words.append(((len(data) & 0xFF) << 56) | int.from_bytes(data[end:], "little"))
    for m in words:
        v[3] ^= m
        v = list(_sipround(*_sipround(*v)))
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        v = list(_sipround(*v))
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def hash_value(text: str, key: str) -> int:
    """``pandas.util.hash_array`` of one string: SipHash-2-4, then pandas' 64-bit mix."""
    h = siphash24(key.encode("utf-8"), text.encode("utf-8", "surrogatepass"))
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & MASK64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & MASK64
    return h ^ (h >> 31)


def _missing(value: object) -> bool:
    return value is None or value == "" or (isinstance(value, float) and value != value)


def _as_text(value: object) -> str:
    """A categorical value as the readers read it: an integral float ``3.0`` is ``"3"``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class RowScorer:
    """Click probabilities of raw rows (dicts of column -> value) with ``preprocess.json``'s rules.

    Every row must hold every feature column, and no column but those and the label: a misspelled
    or absent column would otherwise be scored as a missing value without a word (a serving bug
    nobody sees). ``allow_missing=True`` scores an absent feature column as a missing value (what
    an empty CSV field is). A value that is present but empty is always a missing value.
    """

    def __init__(self, model: torch.nn.Module, preprocess: dict) -> None:
        self.model, self.pre = model, preprocess
        self.oov = int(preprocess["oov_id"])
        self.history = list(preprocess.get("history", []))
        self.columns = [f["name"] for f in preprocess["dense"]] + [f["name"] for f in preprocess["sparse"]]
        self.columns += [f["name"] for f in self.history]
        self.known = set(self.columns) | ({preprocess["label"]} if preprocess.get("label") else set())
        # hash -> id for counted vocabularies: the value at position i has id i + 2
        counted = list(preprocess["sparse"]) + [f["ids"] for f in self.history]
        self.vocabs = {f["name"]: {h: i + 2 for i, h in enumerate(f["hashes"])}
                       for f in counted if f["encoding"] == "vocab" and "hashes" in f}

    def dense_value(self, feature: dict, value: object) -> float:
        """Missing -> 0, then the reader's transform: ``log1p`` of ``max(x, 0)`` (Criteo) or
        ``sign(x) log1p(|x|)`` (tabular)."""
        x = 0.0 if _missing(value) else float(value)
        if feature["transform"] == "log1p":
            return math.log1p(max(x, 0.0))
        if feature["transform"] == "signed_log1p":
            return math.copysign(math.log1p(abs(x)), x)
        return x

    def sparse_id(self, feature: dict, value: object) -> int:
        if _missing(value):
            return 0
        if feature["encoding"] == "id":
            i = int(value)
            return i if 0 <= i < feature["size"] else self.oov
        h = hash_value(_as_text(value), feature["key"])
        if feature["encoding"] == "hash":
            return h % (feature["buckets"] - 1) + 1
        return self.vocabs[feature["name"]].get(h, self.oov)

    def check_row(self, index: int, row: dict, allow_missing: bool = False) -> None:
        """Raise ``ValueError`` naming the row and the column when ``row`` carries a column the model
        does not know, or (unless ``allow_missing``) lacks a feature column."""
        if not isinstance(row, dict):
            raise ValueError(f"row {index}: expected a dict of column -> value, got {type(row).__name__}")
        unknown = [str(c) for c in row if c not in self.known]
        if unknown:
            raise ValueError(f"row {index}: unknown column {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)"
                             if len(unknown) > 1 else "") + f"; the model's columns: {', '.join(self.columns)}")
        absent = [c for c in self.columns if c not in row]
        if absent and not allow_missing:
            raise ValueError(f"row {index}: no column {absent[0]!r}" + (f" (and {len(absent) - 1} more)"
                             if len(absent) > 1 else "") + "; pass allow_missing=True to score absent "
                             "columns as missing values")

    def features(self, rows: list, allow_missing: bool = False) -> tuple:
        """``(dense (B, n_dense) float32, sparse_ids (B, n_sparse) int64)``; rows are checked first
        (:meth:`check_row`), and an empty value is a missing one."""
        for i, r in enumerate(rows):
            self.check_row(i, r, allow_missing)
        dense = [[self.dense_value(f, r.get(f["name"])) for f in self.pre["dense"]] for r in rows]
        ids = [[self.sparse_id(f, r.get(f["name"])) for f in self.pre["sparse"]] for r in rows]
        n_dense, n_sparse = len(self.pre["dense"]), len(self.pre["sparse"])
        return (torch.tensor(dense, dtype=torch.float32).reshape(len(rows), n_dense),
                torch.tensor(ids, dtype=torch.int64).reshape(len(rows), n_sparse))

    def history_ids(self, feature: dict, index: int, value: object) -> list:
        """A raw history (the reader's string of integer ids joined by the delimiter, or a list of ids)
        as the ids of its latest ``max_len`` items; a token that is no integer, or more ids than
        ``bound``, is a ``ValueError`` naming the row and the column."""
        name = feature["name"]
        if _missing(value):
            tokens = []
        elif isinstance(value, str):
            tokens = [t.strip() for t in value.split(feature["delimiter"])]
        elif isinstance(value, (list, tuple)):
            tokens = [_as_text(v) for v in value]
        else:
            raise ValueError(f"row {index}: history column {name!r}: expected a string of ids, got {value!r}")
        tokens = [t for t in tokens if t]
        for t in tokens:
            body = t[1:] if t[:1] in "+-" else t
            if not (body.isascii() and body.isdigit()):
                raise ValueError(f"row {index}: history column {name!r}: {t!r} is not an integer id")
        if len(tokens) > feature["bound"]:
            raise ValueError(f"row {index}: history column {name!r}: {len(tokens)} ids, more than {feature['bound']}")
        return [self.sparse_id(feature["ids"], t) for t in tokens[len(tokens) - min(len(tokens), feature["max_len"]):]]

    def histories(self, rows: list) -> list:
        """Per history column, ``(ids (B, L) int64, mask (B, L) bool)``, right-aligned (pads first)."""
        out = []
        for f in self.history:
            L = f["max_len"]
            ids, mask = torch.zeros(len(rows), L, dtype=torch.int64), torch.zeros(len(rows), L, dtype=torch.bool)
            for b, r in enumerate(rows):
                kept = self.history_ids(f, b, r.get(f["name"]))
                if kept:
                    ids[b, L - len(kept):] = torch.tensor(kept, dtype=torch.int64)
                    mask[b, L - len(kept):] = True
            out.append((ids, mask))
        return out

    @torch.no_grad()
    def __call__(self, rows: list, allow_missing: bool = False) -> torch.Tensor:
        """Click probabilities ``(B,)`` of ``rows`` (see :meth:`features` for ``allow_missing``)."""
        dense, ids = self.features(rows, allow_missing)
        if self.history:
            return torch.sigmoid(self.model(dense, ids, self.histories(rows)))
        return torch.sigmoid(self.model(dense, ids))
