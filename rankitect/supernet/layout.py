"""How a search space maps onto a supernet: shared sites, their widest inputs, and gene roles.

A *site* is one option of one choice at its widest (``"b3.flat/mlp"``: slot 3's flat op when it is
an MLP). Its input is a list of *segments*; a segment holds the *ports* (named outputs such as
``"b1.flat"``, or the raw ``"dense"`` / ``"sparse"``) that can fill it. Ports of one segment never
feed the site together, so they share its units (their weights are shared too); ports in separate
segments get weights of their own. A gene of a decoded architecture gets a *role*: the site whose
weights it uses, the port it writes, and the labels whose gates scale its output and its inputs
(DNAS straight-through gradients; a gate's forward value is 1).

A preset supplies a :class:`Layout` (see :mod:`rankitect.supernet.presets`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankitect.space.architecture import Architecture

Segments = tuple[tuple[str, ...], ...]


def separate(ports: Sequence[str]) -> Segments:
    """One segment per port (ports that may feed a site together)."""
    return tuple((p,) for p in ports)


def shared(ports: Sequence[str]) -> Segments:
    """One segment for all ``ports`` (at most one of them feeds the site at a time)."""
    return (tuple(ports),) if ports else ()


@dataclass(frozen=True)
class Site:
    """One option of one choice, at its widest.

    Args:
        key: ``"<choice site>/<option>"`` or just ``"<site>"`` for a site without options.
        op: the registered block op.
        params: the widest gene params (largest widths, every optional part).
        out: the ports its genes may write.
        fields: field-input segments (field ops).
        flats: flat-input segments: concatenated for a flat op (the right input of a two-input op),
            projected to ``tokens`` tokens for a field op.
        left: the left input's segments of a two-input flat op.
        tokens: the widest token count of a field op's projected flat inputs.
        sequence: the history a history op reads (``"history:<name>"``), its one input.
    """

    key: str
    op: str
    params: Mapping[str, Any]
    out: tuple[str, ...]
    fields: Segments = ()
    flats: Segments = ()
    left: Segments = ()
    tokens: int = 1
    sequence: str | None = None


@dataclass(frozen=True)
class HeadSite:
    """The head at its widest: flat input segments, widest width per hidden layer, depths used."""

    flats: Segments
    widths: tuple[int, ...]
    depths: tuple[int, ...]


@dataclass(frozen=True)
class Role:
    """Where one gene of a decoded architecture sits in the supernet.

    Args:
        key: the :class:`Site` whose weights it uses.
        port: the port its output fills.
        gates: labels whose gates scale its output.
        input_gates: per gene input, the labels whose gates scale that input.
    """

    key: str
    port: str
    gates: tuple[str, ...] = ()
    input_gates: tuple[tuple[str, ...], ...] = field(default=())


class Layout(ABC):
    """A preset's supernet layout: sites in an order where producers come before consumers."""

    embedding_dim: int

    @abstractmethod
    def sites(self) -> list[Site]:
        """Every site, producers before consumers."""

    @abstractmethod
    def head(self) -> HeadSite:
        """The head at its widest."""

    @abstractmethod
    def roles(self, sample: Mapping[str, Any], arch: Architecture) -> tuple[list[Role], tuple[str, ...]]:
        """One role per gene of ``arch`` (decoded from ``sample``) and the labels gating the head."""


def check_ops(arch: Architecture, roles: list[Role], sites: Mapping[str, Site]) -> None:
    """Each gene's op is its site's op: a layout that drifted from its preset's decode fails here."""
    if len(roles) != len(arch.blocks):
        raise ValueError(f"supernet layout gave {len(roles)} roles for {len(arch.blocks)} genes")
    for i, (gene, role) in enumerate(zip(arch.blocks, roles)):
        if role.key not in sites or sites[role.key].op != gene.op:
            raise ValueError(f"supernet layout: gene {i} ({gene.op}) mapped to site {role.key!r}")


__all__ = ["HeadSite", "Layout", "Role", "Segments", "Site", "check_ops", "separate", "shared"]
