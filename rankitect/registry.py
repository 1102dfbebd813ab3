"""One registry type for everything rankitect looks up by name: blocks, search spaces, strategies.

A :class:`Registry` maps a name to an item (a class or a factory); a decorator adds one, a second
item under a taken name is an error, and looking up an unknown name is an error that lists the
known ones:

>>> FRUITS = Registry("fruit")
>>> @FRUITS.register("apple")
... def apple() -> str:
...     return "red"
>>> FRUITS["apple"](), sorted(FRUITS)
('red', ['apple'])
>>> FRUITS["pear"]
Traceback (most recent call last):
...
rankitect.registry.UnknownName: unknown fruit 'pear'; known: ['apple']

It imports only the standard library: block modules use it, and the exporter copies their source,
this module's included, into a ``model.py`` that runs without rankitect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no item is registered under. A ``KeyError`` (a registry is a mapping) and a
    ``ValueError`` (a bad value from a user), whose message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T]):
    """A name -> item map filled by :meth:`register`; read like a ``dict``.

    Args:
        kind: what the items are, for messages (``"block op"``, ``"search space"``, ``"strategy"``).
        base: when given, every item must be a subclass of it (a ``TypeError`` otherwise).
    """

    def __init__(self, kind: str, *, base: type | None = None) -> None:
        self.kind, self.base = kind, base
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator adding its item under ``name`` (see :meth:`add`) and returning it unchanged."""

        def decorate(item: T) -> T:
            return self.add(name, item)

        return decorate

    def add(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; a taken name is a ``ValueError`` naming what holds it."""
        if name in self._items:
            held = getattr(self._items[name], "__qualname__", None) or repr(self._items[name])
            raise ValueError(f"{self.kind} {name!r} is already registered ({held})")
        if self.base is not None and not (isinstance(item, type) and issubclass(item, self.base)):
            raise TypeError(f"{self.kind} {name!r} must subclass {self.base.__name__}, got {item!r}")
        self._items[name] = item
        return item

    def pop(self, name: str, *default: Any) -> Any:
        """Remove ``name`` and return its item (``default`` when given and ``name`` is unknown)."""
        if name in self._items:
            return self._items.pop(name)
        return default[0] if default else self[name]  # self[name]: the UnknownName error

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {sorted(self._items)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._items)})"
