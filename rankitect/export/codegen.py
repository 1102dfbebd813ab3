"""Generate the standalone ``model.py`` of an architecture: PyTorch only, one readable module.

Design: the block code is the blocks' own source (:mod:`rankitect.export.bundle` copies the
modules of the block classes an architecture uses, a user's registered blocks included, with the
builder's ``InputAdapter`` and ``Head`` and :mod:`rankitect.export.bundled_runtime`), so an exported
model runs exactly the code that was trained, and there is no second copy to keep equal. Blocks import
only torch and the standard library, which is what makes that possible; ``tests/export`` runs an
exported file in a process where rankitect cannot be imported.

Safety: the genotype reaches the source only through an :class:`~rankitect.export.plan.ExportPlan`,
whose values are exact ``int``/``bool``/``str`` scalars (or lists of them), registered op names
and a ``float`` in (0, 1), each accepted by the block's own constructor; they are written with
``repr``, which makes them plain literals. Feature names never appear. The result is parsed again
and its imports checked.
"""

from __future__ import annotations

import ast
import math

from rankitect.blocks.base import BLOCKS
from rankitect.blocks.sequence import History
from rankitect.data.spec import FeatureSpec
import rankitect.export.bundled_runtime as bundled_runtime
from rankitect.export.bundle import ALLOWED_IMPORTS, bundle
from rankitect.export.plan import ExportPlan, GenePlan, Ref, make_plan
from rankitect.space import builder
from rankitect.space.architecture import Architecture, history_name

# Imports the generated classes below use, whatever the bundle needs.
HEADER = ("import json", "import math", "import torch", "import torch.nn.functional as F", "from torch import nn")
# ``open`` is allowed: the bundled serving code reads the weights and preprocess.json files.
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "__import__", "globals", "locals", "breakpoint"})
LOAD_SOURCE = '''def load(directory: str) -> ExportedModel:
    """The model with the weights of ``directory/model.safetensors`` (read without the safetensors package)."""
    model = ExportedModel()
    model.load_state_dict(read_safetensors(str(directory) + "/model.safetensors"))
    return model.eval()


def load_scorer(directory: str) -> RowScorer:
    """The model of ``directory`` behind its feature preprocessing (``preprocess.json``): scores raw
    rows, ``load_scorer(d)([{"price": 3.5, "city": "Lyon"}])`` -> click probabilities ``(B,)``. A row
    must hold every feature column and nothing else but the label (a ``ValueError`` names the
    column); ``scorer(rows, allow_missing=True)`` scores absent columns as missing values."""
    with open(str(directory) + "/preprocess.json") as f:
        return RowScorer(load(directory), json.load(f))'''


def generate_source(arch: Architecture, spec: FeatureSpec) -> str:
    """The text of a standalone ``model.py`` for ``arch`` on data described by ``spec``.

    The file holds ``ExportedModel`` (``forward(dense (B, n_dense) float32, sparse_ids (B, n_sparse)
    int64, history) -> logits (B,)``, both inputs in the spec's storage order; ``history`` one
    ``(ids (B, L) int64, mask (B, L) bool)`` pair per sequence feature, right-aligned, for a model
    that reads one), the source of the blocks it uses and ``load(directory)``. Raises ``ValueError``
    for anything unchecked or unsupported.

    >>> from rankitect.space.architecture import BlockGene
    >>> from rankitect.space.testing import tiny_spec
    >>> arch = Architecture((BlockGene("mlp", ("dense",), {"width": 8}),), embedding_dim=4)
    >>> source = generate_source(arch, tiny_spec())
    >>> [line.strip() for line in source.splitlines() if "self.blocks[0]" in line]
    ['x0 = self.blocks[0](*self.adapters[0]([dense]))  # mlp -> (B, 8)']
    """
    plan = make_plan(arch, spec)
    roots: list[object] = [builder._flat, builder._cat, builder.InputAdapter, builder.Head,
                           bundled_runtime.RowScorer, bundled_runtime.read_safetensors,
                           *(BLOCKS[g.op] for g in plan.genes)]
    if plan.embedded:
        roots.append(bundled_runtime.SparseEmbedding)
    if plan.histories:
        roots.append(History)
    body = "\n\n\n".join([bundle(roots, HEADER), _model_class(plan), LOAD_SOURCE])
    source = f"{_module_docstring(plan)}\n{body}\n"
    audit_source(source)
    return source


def audit_source(source: str) -> None:
    """Raise ``ValueError`` unless ``source`` parses and imports only :data:`ALLOWED_IMPORTS` (torch and
    a few standard library modules) and calls no dynamic-code builtin."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = ["." if node.level or node.module is None else node.module]  # relative: refused
        else:
            if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
                raise ValueError(f"generated source refers to {node.id!r}")
            continue
        for m in modules:
            if m.split(".")[0] not in ALLOWED_IMPORTS:
                raise ValueError(f"generated source imports {m!r}; only {list(ALLOWED_IMPORTS)} are allowed")


def _module_docstring(plan: ExportPlan) -> str:
    return (
        f'"""Standalone ranking model exported by rankitect: architecture {plan.arch_hash}.\n\n'
        "Needs only PyTorch. ``load(directory)`` builds :class:`ExportedModel` and reads ``model.safetensors``;\n"
        f"``model(dense, sparse_ids)`` takes dense ``(B, {plan.n_dense})`` float32 and sparse ids\n"
        f"``(B, {plan.n_sparse})`` int64, both in the feature spec's storage order (``feature_spec.json``),\n"
        'and returns logits ``(B,)``. ``load_scorer(directory)`` scores raw rows (dicts of column -> value)\n'
        'with the feature preprocessing of ``preprocess.json``; unseen categorical values get the OOV id, an\n'
        'unknown or absent column is an error (``allow_missing=True`` scores absent ones as missing).\n'
        + (f"A model reading a history takes ``history``: one ``(ids (B, L) int64, mask (B, L) bool)`` pair per\n"
           f"sequence feature ({plan.n_sequence}), right-aligned (pads first, the latest id last); raw rows give it\n"
           "as the reader's string of ids (``preprocess.json`` names the delimiter).\n" if plan.histories else "")
        + '"""\n'
    )


def _render(value: object) -> str:
    """``repr`` of a checked scalar, or a list/tuple of them (tuples of strings become lists)."""
    if type(value) in (bool, int, str) or value is None:
        return repr(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    if type(value) is tuple and value and all(type(v) is str for v in value):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    if type(value) is tuple and all(type(v) is int for v in value):
        return "(" + ", ".join(repr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    raise ValueError(f"cannot render {value!r}")


def _ints(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(_render(v) for v in values) + "]"


def _floats(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(_render(float(v)) for v in values) + "]"


def _shape_comment(shape: tuple[int, ...]) -> str:
    return "(B, " + ", ".join(_render(s) for s in shape) + ")"


def _block_line(i: int, g: GenePlan, plan: ExportPlan) -> str:
    args = [_render(s) for s in g.in_shape]
    args += [f"{k}={_render(v)}" for k, v in g.params]
    args.append(f"request_in={_render(g.request_in)}")
    if g.takes_share and plan.rocs_share is not None:
        args.append(f"rocs_share={_render(plan.rocs_share)}")
    return f"            {g.cls}({', '.join(args)}),  # blocks[{i}]: {g.op}"


def _adapter_line(g: GenePlan, plan: ExportPlan) -> str:
    shapes = "[" + ", ".join(_render(s) for s in g.in_shapes) + "]"
    return (
        f"            InputAdapter({shapes}, {_ints(g.in_requests)}, in_kind={_render(g.in_kind)}, "
        f"num_inputs={_render(g.num_inputs)}, tokens={_render(g.tokens)}, dim={_render(plan.dim)}, "
        f"masked={_render(plan.masked)}{_share_arg(plan)}),"
    )


def _var(ref: Ref) -> str:
    if ref == "sparse":
        return "emb"
    if ref == "dense":
        return "dense"
    name = history_name(ref) if type(ref) is str else None
    if name is not None and name[:1] == "q" and name[1:].isdigit():
        return f"h{int(name[1:])}"
    if type(ref) is int:
        return f"x{ref}"
    raise ValueError(f"cannot name input {ref!r}")


def _init_lines(plan: ExportPlan) -> list[str]:
    lines = ["    def __init__(self) -> None:", "        super().__init__()"]
    if plan.embedded:
        lines += [
            "        # One table per sparse feature in field order (request side first); order[k] is the",
            "        # storage column of field k.",
            f"        self.embedding = SparseEmbedding({_ints(plan.vocab_sizes)}, {_render(plan.dim)}, "
            f"order={_ints(plan.sparse_order)}{_width_args(plan)})",
        ]
    if plan.dense_mean is not None and plan.dense_inv_std is not None:
        lines += [
            "        # Dense features standardized with the training split's mean and 1 / std (storage order).",
            f'        self.register_buffer("dense_mean", torch.tensor({_floats(plan.dense_mean)}), persistent=False)',
            f'        self.register_buffer("dense_inv_std", torch.tensor({_floats(plan.dense_inv_std)}), '
            "persistent=False)",
        ]
    if plan.dense_order is not None and plan.uses_dense:
        dense_order = f"torch.tensor({_ints(plan.dense_order)}, dtype=torch.long)"
        lines += [
            "        # ROCS: dense features request side first.",
            f'        self.register_buffer("dense_order", {dense_order}, persistent=False)',
        ]
    own = [h for h in plan.histories if h.field is None]
    if own:
        tables = ", ".join(f"{_render(str(h.k))}: nn.Embedding({_render(h.vocab_size)}, {_render(plan.dim)})"
                           for h in own)
        lines += ["        # The own table of each history that shares no sparse feature's.",
                  f"        self.history_tables = nn.ModuleDict({{{tables}}})"]
    lines += ["        self.adapters = nn.ModuleList(["]
    lines += [_adapter_line(g, plan) for g in plan.genes]
    lines += ["        ])", "        self.blocks = nn.ModuleList(["]
    lines += [_block_line(i, g, plan) for i, g in enumerate(plan.genes)]
    lines += ["        ])", f"        self.head = Head({_head_args(plan)})"]
    return lines


def _share_arg(plan: ExportPlan) -> str:
    return f", rocs_share={_render(plan.rocs_share)}" if plan.rocs_share is not None else ""


def _width_args(plan: ExportPlan) -> str:
    """Per-field table widths and the projected groups' fields, when a table is not ``dim`` wide."""
    if plan.field_dims is None:
        return ""
    groups = ", ".join(f"{_render(g)}: {_ints(fields)}" for g, fields in plan.projected)
    return f",\n            dims={_ints(plan.field_dims)}, projected={{{groups}}}"


def _head_args(plan: ExportPlan) -> str:
    args = f"{_render(plan.head_in)}, {_ints(plan.head_widths)}"
    if plan.head_requests is not None:
        args = f"{args}, request_in={_render(sum(plan.head_requests))}{_share_arg(plan)}"
    if plan.head_dropout:
        args = f"{args}, dropout={_render(plan.head_dropout)}"
    if plan.head_norm != "none":
        args = f"{args}, norm={_render(plan.head_norm)}"
    return args


def _history_lines(plan: ExportPlan) -> list[str]:
    """Each history read: looked up in its shared field's table (that field is its target) or its own."""
    lines = []
    for h in plan.histories:
        k = _render(h.k)
        lines.append(f"        ids{h.k}, mask{h.k} = history[{k}]  # (B, {h.max_len}) each, right-aligned")
        if h.field is None:
            target = f"torch.zeros(ids{h.k}.shape[0], {_render(plan.dim)})"
            table = f"self.history_tables[{_render(str(h.k))}]"
            lines.append(f"        h{h.k} = History({table}(ids{h.k}), mask{h.k}, {target})")
        else:
            f = _render(h.field)
            lines.append(f"        h{h.k} = History(self.embedding.embed({f}, ids{h.k}), mask{h.k}, emb[:, {f}])")
    return lines


def _forward_lines(plan: ExportPlan) -> list[str]:
    if plan.n_sequence:  # data with histories: the scorer hands them over, read or not
        lines = ["    def forward(self, dense: torch.Tensor, sparse_ids: torch.Tensor, history: list | None = None) "
                 "-> torch.Tensor:"]
    else:
        lines = ["    def forward(self, dense: torch.Tensor, sparse_ids: torch.Tensor) -> torch.Tensor:"]
    if plan.embedded:
        lines.append(f"        emb = self.embedding(sparse_ids)  # (B, {plan.n_sparse}, {plan.dim}) in field order")
    lines += _history_lines(plan)
    if plan.dense_mean is not None:
        lines.append("        dense = (dense - self.dense_mean) * self.dense_inv_std")
    if plan.dense_order is not None and plan.uses_dense:
        lines.append("        dense = dense.index_select(1, self.dense_order)  # request-side dense first")
    for i, g in enumerate(plan.genes):
        xs = ", ".join(_var(r) for r in g.inputs)
        call = f"self.blocks[{i}](*self.adapters[{i}]([{xs}]))"
        lines.append(f"        x{i} = {call}  # {g.op} -> {_shape_comment(g.out_shape)}")
    feats = [f"_flat({_var(r)})" for r in plan.head_inputs]
    head_in = feats[0] if len(feats) == 1 else f"torch.cat([{', '.join(feats)}], dim=1)"
    if plan.head_requests is not None and len(feats) > 1:
        # ROCS: the request units of every head input first.
        head_in = f"_cat([{', '.join(feats)}], {_ints(plan.head_requests)}, True)"
    lines.append(f"        return self.head({head_in})  # (B, {plan.head_in}) -> (B,)")
    return lines


def _model_class(plan: ExportPlan) -> str:
    doc = [
        "class ExportedModel(nn.Module):",
        f'    """Architecture {plan.arch_hash}: {len(plan.genes)} blocks, embedding dim {plan.dim}, '
        f'ROCS masking {"on" if plan.masked else "off"}.',
        "",
        f"    ``forward(dense (B, {plan.n_dense}) float32, sparse_ids (B, {plan.n_sparse}) int64) -> logits (B,)``;",
        "    both inputs in the feature spec's storage order.",
        '    """',
        "",
    ]
    return "\n".join(doc + _init_lines(plan) + [""] + _forward_lines(plan))


__all__ = ["audit_source", "generate_source"]
