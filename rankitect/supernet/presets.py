"""Supernet layouts of the ``nasrec`` and ``engineer`` presets (see :mod:`rankitect.supernet.layout`).

Each layout mirrors its preset's ``decode``: it names the sites (every op at its widest), the
segments of their widest inputs, and, for a decoded architecture, the role of every gene. A layout
that drifts from its preset fails loudly (:func:`~rankitect.supernet.layout.check_ops`).

>>> from rankitect.space import get_space
>>> layout = layout_for(get_space("nasrec", num_blocks=2), tiny_spec_for_doctest())
>>> [s.key for s in layout.sites()][:4]
['b0.efc', 'b0.attention', 'b0.flat/mlp', 'b0.flat/dot']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankitect.blocks.dhen import MODULES
from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture, InputRef, history_ref
from rankitect.space.engineer import LAYER_KNOBS, LAYER_OPS, READOUTS, EngineerSpace
from rankitect.space.history_choices import HISTORY_OPS, KNOBS as HISTORY_KNOBS
from rankitect.space.nasrec import FLAT_OPS, NasrecSpace
from rankitect.space.space import SearchSpace
from rankitect.supernet.layout import HeadSite, Layout, Role, Segments, Site, check_ops, separate, shared


def tiny_spec_for_doctest() -> FeatureSpec:
    from rankitect.space.testing import tiny_spec

    return tiny_spec()


def _largest(space: SearchSpace, label: str) -> Any:
    return max(space.choices[label].options)


class NasrecLayout(Layout):
    """Slot ``k``: ``b{k}.efc``, ``b{k}.attention``, ``b{k}.flat/{mlp,gating,sum,dot}``, ``b{k}.dotmlp``,
    ``b{k}.fm``; ports ``b{k}.field``, ``b{k}.flat``, ``b{k}.fm`` (and the internal ``b{k}.efc``,
    ``b{k}.dot``). Every source has segments of its own; the left input of gating/sum is one
    segment shared by the sources that can come first.
    """

    def __init__(self, space: NasrecSpace, spec: FeatureSpec) -> None:
        self.space, self.spec = space, spec
        self.embedding_dim = space.embedding_dim
        self.use_dense = space.use_dense

    def sites(self) -> list[Site]:
        out: list[Site] = []
        for k in range(self.space.num_blocks):
            out += self._slot_sites(k)
        return out

    def _slot_sites(self, k: int) -> list[Site]:
        b, s = f"b{k}", self.space
        width, tokens = _largest(s, f"{b}.width"), _largest(s, f"{b}.tokens")
        fields = ["sparse", *(f"b{j}.field" for j in range(k))]
        merged = [p for j in range(k) for p in (f"b{j}.flat", f"b{j}.fm")]
        flats = (["dense"] if self.use_dense else []) + merged
        # With no flat source (raw only, no dense features) a flat op reads the flattened embeddings.
        flat_in = flats + ([] if self.use_dense else ["sparse"])
        firsts = ["dense"] if self.use_dense else ["sparse"]
        firsts += [f"b{j}.flat" for j in range(k)]
        sites = [
            Site(f"{b}.efc", "efc", {"out_fields": tokens}, (f"{b}.field", f"{b}.efc"), fields=separate(fields),
                 flats=separate(merged), tokens=s.merge_tokens),
            Site(f"{b}.attention", "attention", {"num_heads": s.num_heads, "ffn": True}, (f"{b}.field",),
                 fields=separate([f"{b}.efc"])),
        ]
        for op in FLAT_OPS:
            if op == "dot":
                sites.append(Site(f"{b}.flat/dot", "dot", {}, (f"{b}.dot",), fields=separate(fields),
                                  flats=separate(flats), tokens=1))
            else:
                left = shared(firsts) if op in ("gating", "sum") else ()
                sites.append(Site(f"{b}.flat/{op}", op, {"width": width}, (f"{b}.flat",), flats=separate(flat_in),
                                  left=left))
        sites.append(Site(f"{b}.dotmlp", "mlp", {"width": width}, (f"{b}.flat",), flats=separate([f"{b}.dot"])))
        sites.append(Site(f"{b}.fm", "fm", {}, (f"{b}.fm",), fields=separate([f"{b}.field"])))
        return sites

    def head(self) -> HeadSite:
        ports = [f"b{k}.{p}" for k in range(self.space.num_blocks) for p in ("flat", "fm", "field")]
        widths = tuple(self.space.head_widths)
        return HeadSite(separate(ports), widths, (len(widths),))

    def roles(self, sample: Mapping[str, Any], arch: Architecture) -> tuple[list[Role], tuple[str, ...]]:
        roles: list[Role] = []
        slot_of: dict[int, int] = {}
        for k in range(self.space.num_blocks):
            start = len(roles)
            roles += self._slot_roles(sample, k)
            slot_of.update({i: k for i in range(start, len(roles))})
        check_ops(arch, roles, {s.key: s for s in self.sites()})
        full = []
        for i, (gene, role) in enumerate(zip(arch.blocks, roles)):
            k = slot_of[i]
            gates = tuple(self._input_gates(sample, arch, k, ref, slot_of, gene.op == "efc") for ref in gene.inputs)
            full.append(Role(role.key, role.port, role.gates, gates))
        return full, ()

    def _slot_roles(self, s: Mapping[str, Any], k: int) -> list[Role]:
        b = f"b{k}"
        field, flat = s[f"{b}.field"], s[f"{b}.flat"]
        efc_gates = (f"{b}.tokens",) + ((f"{b}.field",) if field == "efc" else ())
        roles = [Role(f"{b}.efc", f"{b}.field" if field == "efc" else f"{b}.efc", efc_gates)]
        if field == "attention":
            roles.append(Role(f"{b}.attention", f"{b}.field", (f"{b}.field",)))
        if flat == "dot":
            roles += [Role(f"{b}.flat/dot", f"{b}.dot", (f"{b}.flat",)),
                      Role(f"{b}.dotmlp", f"{b}.flat", (f"{b}.width",))]
        else:
            roles.append(Role(f"{b}.flat/{flat}", f"{b}.flat", (f"{b}.flat", f"{b}.width")))
        if s[f"{b}.fm"]:
            roles.append(Role(f"{b}.fm", f"{b}.fm", (f"{b}.fm",)))
        return roles

    def _input_gates(
        self, s: Mapping[str, Any], arch: Architecture, k: int, ref: InputRef, slot_of: dict[int, int],
        merging: bool,
    ) -> tuple[str, ...]:
        """The in-labels of slot ``k`` that picked ``ref``'s source, plus its merge label when merged."""
        if isinstance(ref, int) and slot_of[ref] == k:
            return ()  # a gene of the same slot (efc -> attention, dot -> mlp, field -> fm)
        src = "raw" if isinstance(ref, str) else str(slot_of[ref])
        picked = tuple(f"b{k}.in{i}" for i in range(min(self.space.max_inputs, k + 1))
                       if s[f"b{k}.in{i}"] == src)
        is_flat = isinstance(ref, int) and arch.kind_of(ref) == "flat"
        return picked + ((f"b{src}.merge",) if merging and is_flat else ())


class EngineerLayout(Layout):
    """Sites ``bottom``, ``buckets``, ``L{i}/{attention/h<heads>,wukong,dhen}``, ``readout/{dot,fm}``,
    ``cross/{full,low}``, ``deep``; ports of the same names. The dense vector (raw or bottom MLP) is
    one shared segment, as are the alternatives of what a stage reads (which layer is last, readout
    or flattened fields); the bucket fields are a segment of their own beside the embeddings. With a
    history: sites ``history/{pool,target,transformer/h<heads>,cross/h<heads>}`` reading it, writing
    port ``history``, a segment of its own wherever it may go (the first layer, the readout, the
    cross and the head).
    """

    def __init__(self, space: EngineerSpace, spec: FeatureSpec) -> None:
        self.space, self.spec = space, spec
        self.embedding_dim = space.embedding_dim
        self.use_dense = space.use_dense
        self.x_dense = shared(["dense", "bottom"]) if self.use_dense else ()
        self.layers = [f"L{i}" for i in range(space.max_depth)]
        self.history = space.history
        self.hist: Segments = separate(["history"]) if self.history is not None else ()

    def _menu(self, name: str) -> Any:
        return max(self.space.menus[name])

    def _layer_params(self, op: str) -> dict[str, Any]:
        if op == "dhen":
            return {"modules": MODULES, "out_fields": self._menu("fields"), "combine": "concat"}
        return {"fmb_fields": self._menu("fields"), "lcb_fields": self._menu("fields"),
                "low_rank": self._menu("wukong_ranks"), "mlp_width": self._menu("layer_widths"),
                "mlp_layers": self._menu("mlp_layers")}

    def _layer_sites(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(key, op, widest params)`` of one layer's sites: one per op, and one attention site per
        head count. Heads split the same projections into different subspaces (and scale scores by
        their own ``sqrt(D / H)``), so weights trained for one head count are wrong for another; an
        attention layer is small (``~16 D^2`` weights), so each count gets its own."""
        out = []
        for op in LAYER_OPS:
            if op == "attention":
                out += [(f"attention/h{h}", op, {"num_heads": h, "ffn": True}) for h in self.space.menus["heads"]]
            else:
                out.append((op, op, self._layer_params(op)))
        return out

    def _history_sites(self) -> list[Site]:
        """One site per history op of the menu; one per head count for the attention ops (as the layers')."""
        if self.history is None:
            return []
        ref, sites = history_ref(self.history.name), []
        for op in self.history.ops:
            if op in ("pool", "target"):
                params = {"width": max(self.history.widths)} if op == "target" else {}
                sites.append(Site(f"history/{op}", HISTORY_OPS[op], params, ("history",), sequence=ref))
            elif op in ("transformer", "cross"):
                sites += [Site(f"history/{op}/h{h}", HISTORY_OPS[op], {"num_heads": h}, ("history",), sequence=ref)
                          for h in self.space.menus["heads"]]
        return sites

    def sites(self) -> list[Site]:
        s, width, tokens = self.space, self._menu("widths"), self._menu("dense_tokens")
        sites = []
        buckets: Segments = ()
        if self.use_dense:
            sites.append(Site("bottom", "mlp", {"width": width, "num_layers": _largest(s, "bottom.layers")},
                              ("bottom",), flats=separate(["dense"])))
            sites.append(Site("buckets", "buckets", {"dim": self.embedding_dim}, ("buckets",),
                              flats=separate(["dense"])))
            buckets = separate(["buckets"])
        sites += self._history_sites()
        for i, name in enumerate(self.layers):
            fields = (*separate(["sparse"]), *buckets, *self.hist) if i == 0 else separate([self.layers[i - 1]])
            flats = self.x_dense if i == 0 else ()
            sites += [Site(f"{name}/{key}", op, params, (name,), fields=fields, flats=flats, tokens=tokens)
                      for key, op, params in self._layer_sites()]
        stream = shared(["sparse", *self.layers])
        sites += [Site(f"readout/{op}", op, {}, ("readout",), fields=(*stream, *buckets, *self.hist),
                       flats=self.x_dense, tokens=tokens)
                  for op in READOUTS if op != "flatten"]
        z = [*shared(["readout", *self.layers]), ("sparse",), *self.x_dense, *self.hist]
        rank, depth = self._menu("cross_ranks"), _largest(s, "cross.layers")
        sites.append(Site("cross/full", "dcn", {"num_layers": depth, "low_rank": 0}, ("cross",), flats=tuple(z)))
        if rank:
            sites.append(Site("cross/low", "dcn", {"num_layers": depth, "low_rank": rank}, ("cross",),
                              flats=tuple(z)))
        sites.append(Site("deep", "mlp", {"width": width, "num_layers": _largest(s, "deep.layers")}, ("deep",),
                          flats=(("sparse",), *self.x_dense)))
        return sites

    def head(self) -> HeadSite:
        flats = (*shared(["cross", "readout", *self.layers]), ("sparse",), *self.x_dense, ("deep",), *self.hist)
        depths = tuple(sorted(self.space.choices["top.layers"].options))
        return HeadSite(flats, (self._menu("widths"),) * max(depths), depths)

    def roles(self, sample: Mapping[str, Any], arch: Architecture) -> tuple[list[Role], tuple[str, ...]]:
        s = sample
        roles: list[Role] = []
        bottom = _has_bottom(arch)
        if bottom:
            roles.append(Role("bottom", "bottom", ("bottom.layers", "bottom.width")))
        if any(g.op == "buckets" for g in arch.blocks):
            roles.append(Role("buckets", "buckets", ("dense.path", "dense.fields")))
        roles += self._history_roles(s)
        for i in range(s["depth"]):
            op = s[f"L{i}.op"]
            knobs = tuple(f"L{i}.{op}.{suffix}" for suffix in LAYER_KNOBS[op])
            key = f"attention/h{s[f'L{i}.attention.heads']}" if op == "attention" else op
            roles.append(Role(f"L{i}/{key}", f"L{i}", ("depth", f"L{i}.op", *knobs)))
        if s["readout"] != "flatten":
            roles.append(Role(f"readout/{s['readout']}", "readout", ("readout",)))
        if s["cross.layers"]:
            key = "cross/full" if s["cross.rank"] == 0 else "cross/low"
            roles.append(Role(key, "cross", ("cross.layers", "cross.rank")))
        if s["deep.layers"]:
            roles.append(Role("deep", "deep", ("deep.layers", "deep.width")))
        check_ops(arch, roles, {site.key: site for site in self.sites()})
        dense_gates = self._dense_gates(s, bottom)
        history = next((i for i, r in enumerate(roles) if r.port == "history"), None)
        path_gates = ("history.path",) if s["depth"] > 0 or s["readout"] != "flatten" else ()
        full = [Role(r.key, r.port, r.gates, tuple(path_gates if ref == history and history is not None
                                                   else dense_gates(ref, r.key) for ref in g.inputs))
                for r, g in zip(roles, arch.blocks)]
        head = ("top.layers", *(f"top.w{i}" for i in range(s["top.layers"])))
        return full, head

    def _history_roles(self, s: Mapping[str, Any]) -> list[Role]:
        """The history gene's role (none without a history or with ``history.op = none``)."""
        if self.history is None or s["history.op"] == "none":
            return []
        op = s["history.op"]
        knobs = tuple(f"history.{op}.{suffix}" for suffix in HISTORY_KNOBS[op])
        key = f"history/{op}/h{s[f'history.{op}.heads']}" if op in ("transformer", "cross") else f"history/{op}"
        return [Role(key, "history", ("history.op", *knobs))]

    def _dense_gates(self, s: Mapping[str, Any], bottom: bool):
        """Labels gating the dense vector where it is read: its path, and its tokens in the fields."""
        x_dense: InputRef | None = None
        if self.use_dense:
            x_dense = 0 if bottom else "dense"
        path_active = self.use_dense and (s["depth"] > 0 or s["readout"] != "flatten")

        def gates(ref: InputRef, key: str) -> tuple[str, ...]:
            if ref != x_dense or not path_active or key == "deep":
                return ()
            into_fields = key.startswith(("L0/", "readout/"))
            return ("dense.path", "dense.fields", "dense.tokens") if into_fields else ("dense.path",)

        return gates


def _has_bottom(arch: Architecture) -> bool:
    """Whether the first gene is the engineer space's bottom MLP (decode leaves it out where unread)."""
    return bool(arch.blocks) and arch.blocks[0].op == "mlp" and arch.blocks[0].inputs == ("dense",)


def layout_for(space: SearchSpace, spec: FeatureSpec) -> Layout:
    """The supernet layout of a preset space (``nasrec`` or ``engineer``)."""
    if isinstance(space, NasrecSpace):
        return NasrecLayout(space, spec)
    if isinstance(space, EngineerSpace):
        return EngineerLayout(space, spec)
    raise ValueError(f"no supernet layout for space {getattr(space, 'name', space)!r}; known: nasrec, engineer")


__all__ = ["EngineerLayout", "NasrecLayout", "layout_for"]
