"""The feature spec: which columns a data set has, their vocabularies and their sides.

A feature is on the ``request`` side (the same for every candidate of one request: user, context)
or the ``candidate`` side (the item being ranked). Models order their fields request side first,
so ROCS masking (request-side outputs depend only on request-side inputs) is a prefix property.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

Side = Literal["request", "candidate"]
SIDES: tuple[str, ...] = ("request", "candidate")


@dataclass(frozen=True)
class DenseFeature:
    """A real-valued feature (already transformed, e.g. log(1 + x)).

    ``mean`` and ``std`` are the training split's statistics of the stored values (the data store
    fills them in when it writes a data set). Models standardize the feature with them,
    ``(x - mean) / std``, as their first step (:class:`~rankitect.space.builder.DenseStandardizer`). Log counts and amounts are
    far from centred (adult's ``fnlwgt`` is 12 +- 0.6 after log1p), and an input of that size
    turns every dense-weight step into a large swing of the logit. The defaults leave a value as
    it is.
    """

    name: str
    side: Side = "candidate"
    mean: float = 0.0
    std: float = 1.0

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.side not in SIDES:
            raise ValueError(f"dense feature {self.name!r}: side must be one of {SIDES}, got {self.side!r}")
        for key in ("mean", "std"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"dense feature {self.name!r}: {key} must be a finite number, got {v!r}")
        if not self.std > 0:
            raise ValueError(f"dense feature {self.name!r}: std must be > 0, got {self.std!r}")


@dataclass(frozen=True)
class SparseFeature:
    """A categorical feature with ids in ``[0, vocab_size)``; id 0 is reserved for missing."""

    name: str
    vocab_size: int
    side: Side = "candidate"

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.side not in SIDES:
            raise ValueError(f"sparse feature {self.name!r}: side must be one of {SIDES}, got {self.side!r}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 2:
            raise ValueError(f"sparse feature {self.name!r}: vocab_size must be an int >= 2, got {self.vocab_size!r}")


@dataclass(frozen=True)
class SequenceFeature:
    """A history column: per row, the ids of the user's earlier items, latest last.

    ``max_len`` is the number of ids a model reads (the latest ``max_len``; a longer history is
    truncated when the data set is written). Ids are in ``[0, vocab_size)``, 0 reserved for
    missing, as for a sparse feature. ``shares`` names the sparse feature whose vocabulary (in the
    data) and embedding table (in a model) the history uses: a history of items shares the
    candidate item's, so the same item has one id and one embedding in both; its ``vocab_size``
    is then that feature's (:class:`FeatureSpec` checks it). A history is the user's, so it is on
    the request side: one history per request, the same for all its candidates.

    >>> SequenceFeature("clicks", 20, 100, shares="item").max_len
    20
    """

    name: str
    max_len: int
    vocab_size: int
    shares: str | None = None
    side: Side = "request"

    def __post_init__(self) -> None:
        _check_name(self.name)
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, int) or self.max_len < 1:
            raise ValueError(f"sequence feature {self.name!r}: max_len must be an int >= 1, got {self.max_len!r}")
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or self.vocab_size < 2:
            raise ValueError(f"sequence feature {self.name!r}: vocab_size must be an int >= 2, got {self.vocab_size!r}")
        if self.shares is not None and not isinstance(self.shares, str):
            raise ValueError(f"sequence feature {self.name!r}: shares must be a sparse feature's name or None, "
                             f"got {self.shares!r}")
        if self.side != "request":
            raise ValueError(f"sequence feature {self.name!r}: a history is request side (the user's), "
                             f"got side {self.side!r}")


@dataclass(frozen=True)
class FeatureSpec:
    """Dense and sparse features of a data set, in storage order, plus the label name.

    Storage order is the column order of the cached arrays. Models read features in
    *field order*: request side first, then candidate side (stable within each side).

    >>> spec = FeatureSpec(dense=(DenseFeature("d0"),),
    ...                    sparse=(SparseFeature("s0", 10), SparseFeature("u0", 5, side="request")))
    >>> spec.n_dense, spec.n_sparse, [f.name for f in spec.sparse_in_field_order()]
    (1, 2, ['u0', 's0'])
    >>> FeatureSpec.from_dict(spec.to_dict()) == spec
    True
    """

    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    label: str = "label"
    name: str = "data"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    sequence: tuple[SequenceFeature, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sequence", tuple(self.sequence))
        names = [f.name for f in self.dense] + [f.name for f in self.sparse] + [f.name for f in self.sequence]
        names.append(self.label)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"feature spec: duplicate column names {dupes}")
        sparse = {f.name: f for f in self.sparse}
        for f in self.sequence:
            if not isinstance(f, SequenceFeature):
                raise ValueError(f"feature spec: sequence entries must be SequenceFeatures, got {f!r}")
            if f.shares is None:
                continue
            if f.shares not in sparse:
                raise ValueError(f"sequence feature {f.name!r}: shares {f.shares!r}, which is no sparse feature "
                                 f"(sparse: {sorted(sparse)})")
            if sparse[f.shares].vocab_size != f.vocab_size:
                raise ValueError(f"sequence feature {f.name!r}: vocab_size {f.vocab_size} differs from the "
                                 f"{sparse[f.shares].vocab_size} of {f.shares!r}, whose vocabulary it shares")

    @property
    def n_dense(self) -> int:
        return len(self.dense)

    @property
    def n_sparse(self) -> int:
        return len(self.sparse)

    @property
    def n_sequence(self) -> int:
        return len(self.sequence)

    def sequence_feature(self, name: str) -> SequenceFeature:
        """The sequence feature ``name``; an unknown name is a ``ValueError`` listing the known ones."""
        for f in self.sequence:
            if f.name == name:
                return f
        raise ValueError(f"feature spec: no sequence feature {name!r}; known: {[f.name for f in self.sequence]}")

    @property
    def sparse_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    def sparse_in_field_order(self) -> list[SparseFeature]:
        """Sparse features request side first (stable), the order models lay out fields."""
        return [f for f in self.sparse if f.side == "request"] + [f for f in self.sparse if f.side == "candidate"]

    @property
    def n_request_sparse(self) -> int:
        return sum(f.side == "request" for f in self.sparse)

    @property
    def n_request_dense(self) -> int:
        return sum(f.side == "request" for f in self.dense)

    def with_dense_stats(self, mean: Any, std: Any) -> FeatureSpec:
        """This spec with each dense feature's training statistics (storage order); a ``std`` that is
        not above ``1e-6`` (a constant column) is kept at 1, so the column is only centred.

        >>> s = FeatureSpec(dense=(DenseFeature("a"), DenseFeature("b")), sparse=())
        >>> [(f.mean, f.std) for f in s.with_dense_stats([12.0, 3.0], [0.5, 0.0]).dense]
        [(12.0, 0.5), (3.0, 1.0)]
        """
        if len(mean) != self.n_dense or len(std) != self.n_dense:
            raise ValueError(f"feature spec: {self.n_dense} dense features, got {len(mean)} means and {len(std)} stds")
        dense = tuple(replace(f, mean=float(m), std=float(sd) if sd > 1e-6 else 1.0)
                      for f, m, sd in zip(self.dense, mean, std))
        return replace(self, dense=dense)

    def with_dense_stats_of(self, other: FeatureSpec) -> FeatureSpec:
        """This spec with ``other``'s dense statistics: trained weights expect their inputs
        standardized as in their own training, whatever the statistics of the data they meet (a
        spec from before the statistics existed has the neutral ones, so such weights see raw
        inputs).

        >>> old = FeatureSpec(dense=(DenseFeature("a", mean=3.0, std=2.0),), sparse=())
        >>> new = FeatureSpec(dense=(DenseFeature("a", mean=5.0, std=1.0),), sparse=())
        >>> new.with_dense_stats_of(old).dense[0]
        DenseFeature(name='a', side='candidate', mean=3.0, std=2.0)
        """
        return self.with_dense_stats([f.mean for f in other.dense], [f.std for f in other.dense])

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON data; ``sequence`` appears only when there is one (a spec without history
        columns keeps the dict, digests and cache keys it always had)."""
        d = {
            "name": self.name,
            "label": self.label,
            "dense": [asdict(f) for f in self.dense],
            "sparse": [asdict(f) for f in self.sparse],
            "extra": dict(self.extra),
        }
        if self.sequence:
            d["sequence"] = [asdict(f) for f in self.sequence]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSpec:
        unknown = set(d) - {"name", "label", "dense", "sparse", "extra", "sequence"}
        if unknown:
            raise ValueError(f"feature spec: unknown keys {sorted(unknown)}")
        return cls(
            dense=tuple(DenseFeature(**f) for f in d.get("dense", [])),
            sparse=tuple(SparseFeature(**f) for f in d.get("sparse", [])),
            label=d.get("label", "label"),
            name=d.get("name", "data"),
            extra=dict(d.get("extra", {})),
            sequence=tuple(SequenceFeature(**f) for f in d.get("sequence", [])),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> FeatureSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"feature name must be an identifier, got {name!r}")
