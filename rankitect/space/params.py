"""A gene's params: an immutable, hashable mapping, checked against the block's constructor.

:func:`canonical_params` fills in the block's defaults, refuses unknown and missing keys, checks
each scalar against the constructor's annotation and stores a float param as a float (``0.0``,
never ``0``), so each value has one JSON spelling and one genotype hash.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from rankitect.blocks.base import block_params

_SCALARS = (bool, int, float, str)
# Int params that may be 0 (every other int param must be >= 1): DCN full rank, a Wukong FMB without hidden layers.
_ZERO_OK = {("dcn", "low_rank"), ("wukong", "mlp_layers")}


def _freeze(key: str, value: Any) -> Any:
    """A JSON-scalar param value, or a tuple of them (lists become tuples)."""
    if isinstance(value, (list, tuple)):
        items = tuple(value)
        if not all(isinstance(v, _SCALARS) for v in items):
            raise ValueError(f"params[{key!r}]: list items must be int/float/bool/str, got {value!r}")
        return items
    if not isinstance(value, _SCALARS):
        raise ValueError(f"params[{key!r}]: must be int/float/bool/str or a list of them, got {value!r}")
    return value


class Params(Mapping[str, Any]):
    """An immutable, hashable, key-sorted mapping of a gene's params (lists held as tuples).

    >>> p = Params({"width": 8, "modules": ["dot", "fm"]})
    >>> list(p), p["modules"], p.to_dict()
    (['modules', 'width'], ('dot', 'fm'), {'modules': ['dot', 'fm'], 'width': 8})
    >>> p == Params({"modules": ("dot", "fm"), "width": 8}) and hash(p) == hash(Params(p))
    True
    """

    __slots__ = ("_items",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        items = dict(data or {})
        for k in items:
            if not isinstance(k, str):
                raise ValueError(f"params: keys must be strings, got {k!r}")
        self._items: tuple[tuple[str, Any], ...] = tuple(sorted((k, _freeze(k, v)) for k, v in items.items()))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Params):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Params({dict(self._items)!r})"

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._items}


def check_int(where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: must be an int >= {minimum}, got {value!r}")
    return value


def canonical_params(op: str, params: Mapping[str, Any]) -> Params:
    """Params with every accepted key (defaults filled in), checked for unknown/missing keys."""
    accepted = block_params(op)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"params: unknown {unknown} for op {op!r}; accepted: {sorted(accepted)}")
    full = dict(params)
    for name, p in accepted.items():
        if name not in full:
            if p.default is inspect.Parameter.empty:
                raise ValueError(f"params: missing {name!r} for op {op!r}")
            full[name] = p.default
    for name, value in full.items():
        if _kind(accepted[name].annotation) == "float" and isinstance(value, int) and not isinstance(value, bool):
            full[name] = float(value)  # one JSON spelling (0.0, not 0) and one hash per value
    frozen = Params(full)
    for name, value in frozen.items():
        _check_param_type(name, value, accepted[name].annotation)
        if isinstance(value, int) and not isinstance(value, bool):
            check_int(f"params[{name!r}]", value, 0 if (op, name) in _ZERO_OK else 1)
    return frozen


def _kind(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")


def _check_param_type(name: str, value: Any, annotation: Any) -> None:
    """Check scalar params against the block's annotation (``int``, ``bool``, ``str``); others pass."""
    kind = _kind(annotation)
    expected = {"int": int, "bool": bool, "str": str, "float": (int, float)}.get(kind)
    if expected is None:
        return
    wrong_bool = isinstance(value, bool) and kind != "bool"
    if wrong_bool or not isinstance(value, expected):
        raise ValueError(f"params[{name!r}]: must be {kind}, got {value!r}")


__all__ = ["Params", "canonical_params", "check_int"]
