"""The ``engineer`` preset: the stacks production rankers are built from, with their knobs as choices.

One template, every part optional; it holds DLRM, DCNv2, DeepFM, AutoInt, Wukong and DHEN
(:mod:`rankitect.space.baselines`)::

    x_dense = dense, or bottom MLP(dense)           bottom.layers (0 = none), bottom.width
    h       = history block(history)                 history.op in {none, pool, target, transformer,
                                                     cross} + its knobs (only with a history)
    fields  = embeddings (+ x_dense as tokens)       dense.path in {top, fields, both}, dense.tokens
              or (+ buckets(dense)) (+ h)            dense.fields in {tokens, buckets}, history.path
    fields  = layer_i(fields), i < depth            depth, L{i}.op in {attention, wukong, dhen} + its knobs
    inter   = readout(fields)                        readout in {flatten, dot, fm}
    z       = [inter (+ x_dense if path is top/both) (+ h if history.path is top)]
    z       = [DCN(z + embeddings)]                  cross.layers (0 = none), cross.rank (0 = full)
    z       = z + [deep MLP(embeddings, x_dense)]    deep.layers (0 = none), deep.width
    logit   = head(z)                                top.layers, top.w0..top.w2

Repairs (deterministic, in decode): ``dense.path = fields`` when nothing consumes fields (depth 0
and readout ``flatten``) sends the dense vector to the top instead (``both`` likewise keeps only its
top part), and the history block's output likewise. The DCN input always includes the flattened
embeddings, so its width is at least ``n_sparse * D``; ``cross.rank`` options must not exceed that
for the data (the default menu, at most 64, fits any data with 4 or more sparse features at D = 16);
the builder names the gene otherwise.

History: built with ``history=<sequence feature>`` (the data has one), the space routes it through
a history block (:mod:`rankitect.space.history_choices`), whose output (fields) joins the field
stream or goes to the top; without it the space is exactly the one without histories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rankitect.space.architecture import Architecture, BlockGene, HeadGene, InputRef
from rankitect.space.history_choices import HISTORY_OPS, HistoryChoices
from rankitect.space.recipe_space import default_recipe_menus
from rankitect.space.space import ROCS_SHARES, Choice, SearchSpace, as_tuple, register_space

LAYER_OPS = ("attention", "wukong", "dhen")
READOUTS = ("flatten", "dot", "fm")
DENSE_PATHS = ("top", "fields", "both")
DENSE_FIELDS = ("tokens", "buckets")
DHEN_MODULES = (
    "dot+attention+linear",
    "dot+linear",
    "attention+linear",
    "dot+attention",
    "dcn+dot+linear",
    "attention+fm+linear",
)
# Knobs of each layer op: label suffix -> (block param, preset option holding its menu).
LAYER_KNOBS: dict[str, dict[str, tuple[str, str]]] = {
    "attention": {"heads": ("num_heads", "heads"), "ffn": ("ffn", "ffn")},
    "wukong": {
        "fmb": ("fmb_fields", "fields"),
        "lcb": ("lcb_fields", "fields"),
        "rank": ("low_rank", "wukong_ranks"),
        "mlp_width": ("mlp_width", "layer_widths"),
        "mlp_layers": ("mlp_layers", "mlp_layers"),
    },
    "dhen": {
        "modules": ("modules", "dhen_modules"),
        "fields": ("out_fields", "fields"),
        "combine": ("combine", "combine"),
    },
}


class EngineerSpace(SearchSpace):
    """The engineer space (see the module docstring); build it with ``get_space("engineer")``."""

    def __init__(
        self, *, max_depth: int, embedding_dim: int, use_dense: bool, menus: dict[str, tuple[Any, ...]],
        rocs: bool = False, rocs_shares: Sequence[float | None] = ROCS_SHARES,
        recipe: Mapping[str, Sequence[Any]] | None = None, history: HistoryChoices | None = None,
    ) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
            raise ValueError(f"option 'max_depth' must be an int >= 0, got {max_depth!r}")
        heads = tuple(h for h in menus["heads"] if embedding_dim % h == 0)
        if not heads:
            raise ValueError(f"option 'heads': none of {list(menus['heads'])} divides embedding_dim={embedding_dim}")
        self.max_depth, self.embedding_dim, self.use_dense = max_depth, embedding_dim, bool(use_dense)
        self.rocs = bool(rocs)
        self.menus = {**menus, "heads": heads, "ffn": (False, True), "combine": ("concat", "sum")}
        self.history = history
        options = {"max_depth": max_depth, "embedding_dim": embedding_dim, "use_dense": self.use_dense, **menus,
                   "rocs": self.rocs}
        if history is not None:  # only then: a space without history keeps its options (and identity)
            options.update(history.options())
        super().__init__("engineer", self._choices(), options, rocs_shares=rocs_shares if self.rocs else None,
                         recipe=recipe)

    def _choices(self) -> list[Choice]:
        m = self.menus
        out = []
        if self.use_dense:
            out += [
                Choice("bottom.layers", (0, 1, 2, 3)),
                Choice("bottom.width", m["widths"]),
                Choice("dense.path", DENSE_PATHS),
                Choice("dense.fields", DENSE_FIELDS),
                Choice("dense.tokens", m["dense_tokens"]),
            ]
        out.append(Choice("depth", tuple(range(self.max_depth + 1))))
        for i in range(self.max_depth):
            out.append(Choice(f"L{i}.op", LAYER_OPS))
            for op, knobs in LAYER_KNOBS.items():
                out += [Choice(f"L{i}.{op}.{suffix}", self.menus[menu]) for suffix, (_, menu) in knobs.items()]
        out += [
            Choice("readout", READOUTS),
            Choice("cross.layers", (0, 1, 2, 3, 4)),
            Choice("cross.rank", m["cross_ranks"]),
            Choice("deep.layers", (0, 1, 2, 3)),
            Choice("deep.width", m["widths"]),
            Choice("top.layers", (0, 1, 2, 3)),
        ]
        out += [Choice(f"top.w{i}", m["widths"]) for i in range(3)]
        if self.history is not None:
            out += self.history.choices(self.menus["heads"])
        return out

    def _decode(self, s: Mapping[str, Any]) -> Architecture:
        genes: list[BlockGene] = []

        def add(gene: BlockGene) -> int:
            genes.append(gene)
            return len(genes) - 1

        x_dense: InputRef | None = None
        depth, readout = s["depth"], s["readout"]
        path = "top"  # also the repair when nothing consumes fields (depth 0, flatten readout)
        bucketed = False
        if self.use_dense:
            layers = s["bottom.layers"]
            x_dense = "dense"
            if depth > 0 or readout != "flatten":
                path = s["dense.path"]
            bucketed = path in ("fields", "both") and s["dense.fields"] == "buckets"
            # The bottom MLP where its output is read: the top, the field tokens or the deep tower.
            if layers and (not bucketed or path == "both" or s["deep.layers"]):
                x_dense = add(BlockGene("mlp", ("dense",), {"width": s["bottom.width"], "num_layers": layers}))
        into_fields = x_dense is not None and path in ("fields", "both")
        cur: tuple[InputRef, ...] = ("sparse",)
        tokens = 1
        if bucketed:
            cur = ("sparse", add(BlockGene("buckets", ("dense",), {"dim": self.embedding_dim})))
        elif into_fields:
            cur, tokens = ("sparse", x_dense), s["dense.tokens"]
        history, history_top = None, False
        if self.history is not None and (gene := self.history.decode(s)) is not None:
            history = add(gene)
            history_top = (depth == 0 and readout == "flatten") or s["history.path"] == "top"
            cur = cur if history_top else (*cur, history)
        for i in range(depth):
            op = s[f"L{i}.op"]
            knobs = {param: s[f"L{i}.{op}.{suffix}"] for suffix, (param, _) in LAYER_KNOBS[op].items()}
            if op == "dhen":
                knobs["modules"] = tuple(knobs["modules"].split("+"))
            cur, tokens = (add(BlockGene(op, cur, knobs, tokens=tokens)),), 1
        z: list[InputRef] = list(cur) if readout == "flatten" else [add(BlockGene(readout, cur, tokens=tokens))]
        if x_dense is not None and path in ("top", "both"):
            z.append(x_dense)
        if history is not None and history_top:
            z.append(history)
        if s["cross.layers"]:
            cross_in = (*z, "sparse") if "sparse" not in z else tuple(z)
            z = [add(BlockGene("dcn", cross_in, {"num_layers": s["cross.layers"], "low_rank": s["cross.rank"]}))]
        if s["deep.layers"]:
            deep_in = ("sparse", x_dense) if x_dense is not None else ("sparse",)
            z.append(add(BlockGene("mlp", deep_in, {"width": s["deep.width"], "num_layers": s["deep.layers"]})))
        widths = tuple(s[f"top.w{i}"] for i in range(s["top.layers"]))
        return Architecture(tuple(genes), HeadGene(tuple(z), widths), self.embedding_dim, rocs=self.rocs)

    def _encode(self, arch: Architecture) -> dict[str, Any] | None:
        if arch.embedding_dim != self.embedding_dim or arch.rocs != self.rocs:
            return None
        out: dict[str, Any] = {}
        genes, p = arch.blocks, 0
        x_dense: InputRef | None = None
        if self.use_dense:
            out["bottom.layers"], x_dense = 0, "dense"
            if genes and genes[0].op == "mlp" and genes[0].inputs == ("dense",):
                out["bottom.layers"], out["bottom.width"] = genes[0].params["num_layers"], genes[0].params["width"]
                x_dense = 0
                p = 1
        buckets: int | None = None
        if p < len(genes) and genes[p].op == "buckets":
            out["dense.fields"], buckets, p = "buckets", p, p + 1
        history: int | None = None
        if self.history is not None:
            read = self.history.encode(genes[p] if p < len(genes) else None)
            out.update(read)
            if read["history.op"] != "none":
                history, p = p, p + 1
        first = genes[p] if p < len(genes) else None
        if history is not None:
            out["history.path"] = "fields" if first is not None and first.op in (*LAYER_OPS, *READOUTS) \
                and history in first.inputs else "top"
        field_in = x_dense if buckets is None else buckets
        into_fields = first is not None and first.op in (*LAYER_OPS, *READOUTS) and field_in in first.inputs
        if into_fields and buckets is None:
            out["dense.tokens"] = first.tokens
        depth = 0
        while p < len(genes) and genes[p].op in LAYER_OPS:
            op = genes[p].op
            out[f"L{depth}.op"] = op
            for suffix, (param, _) in LAYER_KNOBS[op].items():
                v = genes[p].params[param]
                out[f"L{depth}.{op}.{suffix}"] = "+".join(v) if param == "modules" else v
            depth, p = depth + 1, p + 1
        out["depth"], out["readout"] = depth, "flatten"
        if p < len(genes) and genes[p].op in ("dot", "fm"):
            out["readout"], p = genes[p].op, p + 1
        in_top = x_dense is not None and (x_dense in arch.head.inputs or any(
            g.op == "dcn" and x_dense in g.inputs for g in genes))
        if x_dense is not None:
            out["dense.path"] = "both" if into_fields and in_top else ("fields" if into_fields else "top")
        out["cross.layers"] = 0
        if p < len(genes) and genes[p].op == "dcn":
            out["cross.layers"], out["cross.rank"] = genes[p].params["num_layers"], genes[p].params["low_rank"]
            p += 1
        out["deep.layers"] = 0
        if p < len(genes) and genes[p].op == "mlp":
            out["deep.layers"], out["deep.width"], p = genes[p].params["num_layers"], genes[p].params["width"], p + 1
        out["top.layers"] = len(arch.head.widths)
        out.update({f"top.w{i}": w for i, w in enumerate(arch.head.widths)})
        return out if p == len(genes) else None


@register_space("engineer")
def engineer_space(
    *,
    max_depth: int = 4,
    embedding_dim: int = 16,
    use_dense: bool = True,
    widths: Sequence[int] = (64, 128, 256, 400, 512, 1024),
    layer_widths: Sequence[int] = (64, 128, 256, 512),
    fields: Sequence[int] = (8, 16, 32),
    heads: Sequence[int] = (1, 2, 4),
    wukong_ranks: Sequence[int] = (8, 16, 24, 32),
    mlp_layers: Sequence[int] = (1, 2, 3),
    dhen_modules: Sequence[str] = DHEN_MODULES,
    cross_ranks: Sequence[int] = (0, 16, 32, 64),
    dense_tokens: Sequence[int] = (1, 2, 4),
    rocs: bool = False,
    rocs_shares: Sequence[float | None] = ROCS_SHARES,
    recipe: Mapping[str, Sequence[Any]] | None = None,
    history: str | None = None,
    history_ops: Sequence[str] = tuple(HISTORY_OPS),
    history_widths: Sequence[int] = (20, 40, 80),
) -> EngineerSpace:
    """Stacks of attention / Wukong / DHEN layers, a readout, optional DCN, deep tower and top MLP.

    Menus: ``widths`` (bottom, deep and top MLPs), ``layer_widths`` (Wukong FMB MLP), ``fields``
    (Wukong FMB/LCB and DHEN output fields), ``heads``, ``wukong_ranks``, ``mlp_layers`` (Wukong),
    ``dhen_modules`` (``+``-joined module names), ``cross_ranks`` (0 = full rank),
    ``dense_tokens`` (tokens of the dense vector in the field stream); ``rocs=True`` holds only
    ROCS-masked architectures (request-side work runs once per request), with ``rocs_shares`` the
    menu of their request share (:data:`~rankitect.space.space.ROCS_SHARES`). ``recipe`` maps
    recipe genes to their menus (``None``: the defaults of
    :func:`~rankitect.space.recipe_space.default_recipe_menus`; ``{}``: no recipe choice).
    ``history`` names the data's sequence feature to route through a history block, chosen from
    ``history_ops`` (``none``, ``pool``, ``target``, ``transformer``, ``cross``; a history that
    shares no candidate table takes ``none`` and ``pool`` only) with ``history_widths`` the menu of
    target attention's hidden width; ``None`` (the default): no history choice at all.
    """
    menus = {
        "widths": widths, "layer_widths": layer_widths, "fields": fields, "heads": heads,
        "wukong_ranks": wukong_ranks, "mlp_layers": mlp_layers, "dhen_modules": dhen_modules,
        "cross_ranks": cross_ranks, "dense_tokens": dense_tokens,
    }
    return EngineerSpace(
        max_depth=max_depth, embedding_dim=embedding_dim, use_dense=use_dense,
        menus={k: as_tuple(k, v) for k, v in menus.items()}, rocs=rocs, rocs_shares=rocs_shares,
        recipe=default_recipe_menus(embedding_dim) if recipe is None else recipe,
        history=None if history is None else HistoryChoices(history, as_tuple("history_ops", history_ops),
                                                            as_tuple("history_widths", history_widths)),
    )
