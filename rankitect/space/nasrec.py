"""The ``nasrec`` preset: NASRec-Full's 7 blocks of one flat op and one field op each.

After NASRec (Zhang et al., WWW'23, arXiv 2207.07187; REFERENCES.md). A NASRec block has a flat
output and a field output; here a *slot* is a short run of one-op genes sharing the slot's inputs:

* **sources**: ``b{k}.in0 .. in3`` pick up to 4 distinct earlier outputs: ``"raw"`` (NASRec's
  output 0: the dense features as the flat part, the embeddings as the field part) or an earlier
  slot ``"j"`` (its flat and field outputs). ``"none"`` leaves an input slot empty; repeats are
  ignored and sources are put in a canonical order (raw first, then by slot), so input order never
  makes two different genotypes of one network.
* **field op** (``b{k}.field``): an ``efc`` to ``b{k}.tokens`` fields over the sources' field
  parts, followed, for ``attention``, by a transformer layer on those fields (so the field count
  stays one of NASRec's token counts).
* **flat op** (``b{k}.flat``, width ``b{k}.width``): ``mlp`` (FC) / ``gating`` / ``sum`` over the
  sources' flat parts (``gating``/``sum``: left = first, right = the rest), or ``dot``: pairwise
  dot products of the field parts plus the flat parts projected to one token, then an ``mlp`` to
  the width (NASRec's dot product also ends at the block width). When the sources have no flat
  part (``raw`` only, no dense features) the flat op reads the flattened field parts.
* **FM** (``b{k}.fm``): a field-wise ``fm`` over the field output, *concatenated* to the flat
  output (NASRec adds it; concatenation keeps one op per gene and loses nothing).
* **merge** (``b{j}.merge``, NASRec's dense-to-sparse merger): slot ``j``'s flat output also
  enters the field stream of every slot that reads ``j``, projected to ``merge_tokens`` (8) tokens.
  Inactive when no later slot reads ``j``.

The head reads every gene output that no later gene reads (the last slot's flat and field outputs,
and any slot nobody consumed), flattened, into ``head_widths`` layers and one logit (NASRec: one
linear layer). Every combination decodes to a valid architecture: no repair is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rankitect.space.architecture import Architecture, BlockGene, HeadGene, InputRef
from rankitect.space.recipe_space import default_recipe_menus
from rankitect.space.space import ROCS_SHARES, Choice, SearchSpace, as_tuple, register_space

NASREC_WIDTHS = (16, 32, 64, 128, 256, 512, 768, 1024)
NASREC_TOKENS = (16, 32, 48, 64)
FLAT_OPS = ("mlp", "dot", "gating", "sum")
FIELD_OPS = ("attention", "efc")


def _source_key(src: str) -> int:
    return -1 if src == "raw" else int(src)


class NasrecSpace(SearchSpace):
    """The NASRec-like space (see the module docstring); build it with ``get_space("nasrec")``."""

    def __init__(
        self,
        *,
        num_blocks: int,
        widths: Sequence[int],
        tokens: Sequence[int],
        max_inputs: int,
        merge_tokens: int,
        num_heads: int,
        embedding_dim: int,
        use_dense: bool,
        head_widths: Sequence[int],
        rocs: bool = False,
        rocs_shares: Sequence[float | None] = ROCS_SHARES,
        recipe: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        for name, v in {"num_blocks": num_blocks, "max_inputs": max_inputs, "merge_tokens": merge_tokens}.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"option {name!r} must be an int >= 1, got {v!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or embedding_dim % num_heads:
            raise ValueError(f"option 'num_heads'={num_heads!r} must divide embedding_dim={embedding_dim}")
        self.num_blocks, self.max_inputs, self.merge_tokens = num_blocks, max_inputs, merge_tokens
        self.num_heads, self.embedding_dim, self.use_dense = num_heads, embedding_dim, bool(use_dense)
        self.head_widths = tuple(head_widths)
        self.rocs = bool(rocs)
        widths, tokens = as_tuple("widths", widths), as_tuple("tokens", tokens)
        options = {
            "num_blocks": num_blocks, "widths": widths, "tokens": tokens, "max_inputs": max_inputs,
            "merge_tokens": merge_tokens, "num_heads": num_heads, "embedding_dim": embedding_dim,
            "use_dense": self.use_dense, "head_widths": self.head_widths, "rocs": self.rocs,
        }
        super().__init__("nasrec", self._choices(widths, tokens), options,
                         rocs_shares=rocs_shares if self.rocs else None, recipe=recipe)

    def _choices(self, widths: tuple[int, ...], tokens: tuple[int, ...]) -> list[Choice]:
        out = []
        for k in range(self.num_blocks):
            sources = ("raw", *(str(j) for j in range(k)))
            for i in range(min(self.max_inputs, k + 1)):
                out.append(Choice(f"b{k}.in{i}", sources if i == 0 else ("none", *sources)))
            out += [
                Choice(f"b{k}.flat", FLAT_OPS),
                Choice(f"b{k}.field", FIELD_OPS),
                Choice(f"b{k}.width", widths),
                Choice(f"b{k}.tokens", tokens),
                Choice(f"b{k}.fm", (False, True)),
                Choice(f"b{k}.merge", (False, True)),
            ]
        return out

    def _sources(self, s: Mapping[str, Any], k: int) -> list[str]:
        picked = {s[f"b{k}.in{i}"] for i in range(min(self.max_inputs, k + 1))} - {"none"}
        return sorted(picked, key=_source_key)

    def _decode(self, s: Mapping[str, Any]) -> Architecture:
        genes: list[BlockGene] = []
        flat_out: dict[str, list[InputRef]] = {"raw": ["dense"] if self.use_dense else []}
        field_out: dict[str, list[InputRef]] = {"raw": ["sparse"]}
        for k in range(self.num_blocks):
            srcs = self._sources(s, k)
            flats = [r for src in srcs for r in flat_out[src]]
            fields = [r for src in srcs for r in field_out[src]]
            merged = [r for src in srcs if src != "raw" and s[f"b{src}.merge"] for r in flat_out[src]]
            field_ref = self._field_op(s, k, genes, fields, merged)
            flat_out[str(k)] = [self._flat_op(s, k, genes, fields, flats)]
            field_out[str(k)] = [field_ref]
            if s[f"b{k}.fm"]:
                genes.append(BlockGene("fm", (field_ref,)))
                flat_out[str(k)].append(len(genes) - 1)
        consumed = {r for g in genes for r in g.inputs}
        head = tuple(i for i in range(len(genes)) if i not in consumed)
        return Architecture(tuple(genes), HeadGene(head, self.head_widths), self.embedding_dim, rocs=self.rocs)

    def _field_op(
        self, s: Mapping[str, Any], k: int, genes: list[BlockGene], fields: list[InputRef], merged: list[InputRef]
    ) -> int:
        tokens = self.merge_tokens if merged else 1
        genes.append(BlockGene("efc", (*fields, *merged), {"out_fields": s[f"b{k}.tokens"]}, tokens=tokens))
        if s[f"b{k}.field"] == "attention":
            genes.append(BlockGene("attention", (len(genes) - 1,), {"num_heads": self.num_heads, "ffn": True}))
        return len(genes) - 1

    def _flat_op(
        self, s: Mapping[str, Any], k: int, genes: list[BlockGene], fields: list[InputRef], flats: list[InputRef]
    ) -> int:
        op, width = s[f"b{k}.flat"], s[f"b{k}.width"]
        if op == "dot":
            genes.append(BlockGene("dot", (*fields, *flats)))
            genes.append(BlockGene("mlp", (len(genes) - 1,), {"width": width}))
        else:
            genes.append(BlockGene(op, tuple(flats or fields), {"width": width}))
        return len(genes) - 1

    def _encode(self, arch: Architecture) -> dict[str, Any] | None:
        if arch.embedding_dim != self.embedding_dim or arch.head.widths != self.head_widths or arch.rocs != self.rocs:
            return None
        out: dict[str, Any] = {}
        slot_of: dict[int, str] = {}
        p = 0
        for k in range(self.num_blocks):
            p = self._encode_slot(arch, k, p, out, slot_of)
        return out if p == len(arch.blocks) else None

    def _encode_slot(self, arch: Architecture, k: int, p: int, out: dict[str, Any], slot_of: dict[int, str]) -> int:
        """Read slot ``k`` starting at gene ``p`` into ``out``; returns the next slot's first gene."""
        genes, b, start = arch.blocks, f"b{k}", p
        efc = genes[p]
        if efc.op != "efc":
            raise ValueError(f"gene {p} is not the efc that opens slot {k}")
        out[f"{b}.tokens"], out[f"{b}.field"] = efc.params["out_fields"], "efc"
        field_ref, p = p, p + 1
        if p < len(genes) and genes[p].op == "attention" and genes[p].inputs == (field_ref,):
            out[f"{b}.field"], field_ref, p = "attention", p, p + 1
        flat = genes[p]
        out[f"{b}.flat"] = flat.op
        width_gene = genes[p + 1] if flat.op == "dot" else flat
        out[f"{b}.width"] = width_gene.params["width"]
        p += 2 if flat.op == "dot" else 1
        out[f"{b}.fm"] = p < len(genes) and genes[p].op == "fm" and genes[p].inputs == (field_ref,)
        p += int(out[f"{b}.fm"])
        srcs = {"raw" if isinstance(ref, str) else slot_of[ref] for ref in (*efc.inputs, *flat.inputs)}
        for ref in efc.inputs:
            if isinstance(ref, int) and arch.kind_of(ref) == "flat":
                out[f"b{slot_of[ref]}.merge"] = True
        ordered = sorted(srcs, key=_source_key)
        if len(ordered) > min(self.max_inputs, k + 1):
            raise ValueError(f"slot {k} reads {len(ordered)} sources")
        for i in range(min(self.max_inputs, k + 1)):
            out[f"{b}.in{i}"] = ordered[i] if i < len(ordered) else "none"
        slot_of.update({i: str(k) for i in range(start, p)})
        return p


@register_space("nasrec")
def nasrec_space(
    *,
    num_blocks: int = 7,
    widths: Sequence[int] = NASREC_WIDTHS,
    tokens: Sequence[int] = NASREC_TOKENS,
    max_inputs: int = 4,
    merge_tokens: int = 8,
    num_heads: int = 2,
    embedding_dim: int = 16,
    use_dense: bool = True,
    head_widths: Sequence[int] = (),
    rocs: bool = False,
    rocs_shares: Sequence[float | None] = ROCS_SHARES,
    recipe: Mapping[str, Sequence[Any]] | None = None,
) -> NasrecSpace:
    """NASRec-Full (7 blocks, widths 16..1024, 16..64 tokens, <= 4 inputs, D = 16); smaller menus for tests.

    ``use_dense=False`` for data without dense features; ``head_widths`` adds hidden head layers;
    ``rocs=True`` holds only ROCS-masked architectures (request-side work runs once per request),
    with ``rocs_shares`` the menu of their request share (:data:`~rankitect.space.space.ROCS_SHARES`).
    ``recipe`` maps recipe genes to their menus (``None``: the defaults of
    :func:`~rankitect.space.recipe_space.default_recipe_menus`; ``{}``: no recipe choice).
    """
    return NasrecSpace(
        num_blocks=num_blocks, widths=widths, tokens=tokens, max_inputs=max_inputs, merge_tokens=merge_tokens,
        num_heads=num_heads, embedding_dim=embedding_dim, use_dense=use_dense, head_widths=head_widths,
        rocs=rocs, rocs_shares=rocs_shares,
        recipe=default_recipe_menus(embedding_dim) if recipe is None else recipe,
    )


@register_space("nasrec_full")
def nasrec_full_space(
    *, embedding_dim: int = 16, use_dense: bool = True, rocs: bool = False,
    rocs_shares: Sequence[float | None] = ROCS_SHARES, recipe: Mapping[str, Sequence[Any]] | None = None,
) -> NasrecSpace:
    """NASRec-Full's menus by name, whatever the data (``search.space=nasrec_full``); the space is
    ``nasrec`` with its default menus, never sized (:mod:`rankitect.search.proposing.sizing`)."""
    return nasrec_space(embedding_dim=embedding_dim, use_dense=use_dense, rocs=rocs, rocs_shares=rocs_shares,
                        recipe=recipe)
