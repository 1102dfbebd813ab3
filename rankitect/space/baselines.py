"""Hand-built ranking models written as genotypes: what every search must beat.

Each is the published structure at our embedding dimension, and each lies in the ``engineer``
space built with the same ``embedding_dim`` and ``use_dense = spec.n_dense > 0``
(:func:`engineer_space_for`). None lies in ``nasrec``: every NASRec slot carries a field op, and
these models have none. Shared simplifications: our MLP layers end in LayerNorm (NASRec's FC);
dense features enter the field stream through one learned projection to one token (DLRM's
bottom-MLP output, AutoInt's numerical embeddings, Wukong's dense embedding), and where a data set
has no dense features the dense parts are simply left out.

DIN and BST (:data:`HISTORY_BASELINES`) read a user history: they exist only for data with a history
that shares the candidate item's table (:func:`baselines_for`), and lie in the ``engineer`` space
built for such data (:func:`engineer_space_for`).
"""

from __future__ import annotations

from collections.abc import Callable

from collections.abc import Sequence

from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture, BlockGene, HeadGene, InputRef, history_ref
from rankitect.space.history_choices import HISTORY_OPS
from rankitect.space.space import SearchSpace, get_space


def _dense_in(spec: FeatureSpec) -> tuple[InputRef, ...]:
    return ("dense",) if spec.n_dense else ()


def dlrm(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """DLRM (Naumov et al. 2019, arXiv 1906.00091).

    Bottom MLP on the dense features (2 x 256, projected to one D-dim token), pairwise dot products
    of that token and all embeddings, concatenated with the bottom output, top MLP 512-256-1.
    """
    if not spec.n_dense:
        return Architecture((BlockGene("dot", ("sparse",)),), HeadGene((0,), (512, 256)), embedding_dim)
    genes = (
        BlockGene("mlp", ("dense",), {"width": 256, "num_layers": 2}),
        BlockGene("dot", ("sparse", 0), tokens=1),
    )
    return Architecture(genes, HeadGene((1, 0), (512, 256)), embedding_dim)


def dcnv2(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """DCNv2, stacked (Wang et al., WWW'21, arXiv 2008.13535).

    ``x_0 = [flattened embeddings, dense]``, 3 full-rank cross layers
    ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``, then a deep network of 3 x 400 and the logit.
    """
    genes = (BlockGene("dcn", ("sparse", *_dense_in(spec)), {"num_layers": 3, "low_rank": 0}),)
    return Architecture(genes, HeadGene((0,), (400, 400, 400)), embedding_dim)


def deepfm(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """DeepFM (Guo et al., IJCAI'17, arXiv 1703.04247).

    An FM over the embeddings and a deep network (3 x 400) over the same embeddings (and dense
    features), side by side; the head is one linear layer over [FM, dense, deep], i.e.
    ``y = y_FM + y_DNN`` with learned weights. The FM keeps its D coordinates (field-wise FM) and the
    head sums them; the first-order term is the head's weights on the dense features (per-id scalar
    weights of the sparse features are left out: the deep tower subsumes them).
    """
    genes = (
        BlockGene("fm", ("sparse",)),
        BlockGene("mlp", ("sparse", *_dense_in(spec)), {"width": 400, "num_layers": 3}),
    )
    return Architecture(genes, HeadGene((0, *_dense_in(spec), 1), ()), embedding_dim)


def autoint(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """AutoInt (Song et al., CIKM'19, arXiv 1810.11921).

    Embeddings (dense features projected to one token), 3 interacting layers of multi-head
    self-attention (2 heads, residual, no FFN), flattened into one linear logit.
    """
    heads = 2 if embedding_dim % 2 == 0 else 1
    knobs = {"num_heads": heads, "ffn": False}
    genes = (
        BlockGene("attention", ("sparse", *_dense_in(spec)), knobs, tokens=1),
        BlockGene("attention", (0,), knobs),
        BlockGene("attention", (1,), knobs),
    )
    return Architecture(genes, HeadGene((2,), ()), embedding_dim)


def wukong(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """Wukong (Zhang et al., ICML'24, arXiv 2403.02545).

    3 Wukong layers (FMB of rank 24 with a 2 x 512 MLP to 16 fields, LCB to 16 fields, residual,
    LayerNorm) on the embeddings and a dense token, flattened into a top MLP 512-256-1.
    """
    knobs = {"fmb_fields": 16, "lcb_fields": 16, "low_rank": 24, "mlp_width": 512, "mlp_layers": 2}
    genes = (
        BlockGene("wukong", ("sparse", *_dense_in(spec)), knobs, tokens=1),
        BlockGene("wukong", (0,), knobs),
        BlockGene("wukong", (1,), knobs),
    )
    return Architecture(genes, HeadGene((2,), (512, 256)), embedding_dim)


def dhen(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """DHEN (Zhang et al. 2022, arXiv 2203.11014).

    2 DHEN layers, each an ensemble of dot-product, self-attention and linear modules to 16 fields,
    concatenated, with a shortcut and LayerNorm, on the embeddings and a dense token; flattened into
    a top MLP 512-256-1.
    """
    knobs = {"modules": ("dot", "attention", "linear"), "out_fields": 16, "combine": "concat"}
    genes = (
        BlockGene("dhen", ("sparse", *_dense_in(spec)), knobs, tokens=1),
        BlockGene("dhen", (0,), knobs),
    )
    return Architecture(genes, HeadGene((1,), (512, 256)), embedding_dim)


def target_history(spec: FeatureSpec) -> str | None:
    """The first sequence feature of ``spec`` that shares a sparse feature's table (a history a
    block can read with the candidate item), or ``None``."""
    return next((f.name for f in spec.sequence if f.shares is not None), None)


def _history_top(spec: FeatureSpec, op: str, params: dict, widths: tuple[int, ...], embedding_dim: int) -> Architecture:
    """The embeddings, the dense features and one history block's output, flattened into a top MLP."""
    name = target_history(spec)
    if name is None:
        raise ValueError("this baseline reads a user history: the data needs a history (sequence) column that "
                         "shares the candidate item's vocabulary ('shares' in the schema)")
    gene = BlockGene(op, (history_ref(name),), params)
    return Architecture((gene,), HeadGene(("sparse", *_dense_in(spec), 0), widths), embedding_dim)


def din(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """DIN (Zhou et al., KDD'18, arXiv 1706.06978).

    Target attention over the history (the candidate item as the query; an 80-40 activation MLP
    weighing each item, no softmax), the user's interest concatenated with the embeddings (and
    dense features) into a top MLP 512-256-1 (the paper's is 200-80: the widths of every sized
    space are used instead).
    """
    return _history_top(spec, "target_attention", {"width": 80}, (512, 256), embedding_dim)


def bst(spec: FeatureSpec, embedding_dim: int = 16) -> Architecture:
    """BST (Chen et al., DLP-KDD'19, arXiv 1905.06874).

    One transformer layer (2 heads, FFN, residual, LayerNorm, a position embedding) over the
    history and the candidate item, its outputs flattened and concatenated with the embeddings
    (and dense features) into a top MLP 512-256-1 (the paper: 8 heads, 1024-512-256).
    """
    heads = 2 if embedding_dim % 2 == 0 else 1
    return _history_top(spec, "history_transformer", {"num_heads": heads}, (512, 256), embedding_dim)


BASELINES: dict[str, Callable[[FeatureSpec, int], Architecture]] = {
    "dlrm": dlrm,
    "dcnv2": dcnv2,
    "deepfm": deepfm,
    "autoint": autoint,
    "wukong": wukong,
    "dhen": dhen,
}
# Baselines that read a user history: only for data with one (:func:`baselines_for`).
HISTORY_BASELINES: dict[str, Callable[[FeatureSpec, int], Architecture]] = {"din": din, "bst": bst}
DEFAULT_BASELINES = tuple(BASELINES)  # search.baselines' default


def baselines_for(spec: FeatureSpec) -> list[str]:
    """The baselines that exist for ``spec``: the six, and DIN and BST when it has a history a
    target can read (:func:`target_history`).

    >>> from rankitect.space.testing import tiny_spec
    >>> baselines_for(tiny_spec())[-1], baselines_for(tiny_spec(history=4))[-2:]
    ('dhen', ['din', 'bst'])
    """
    return [*BASELINES, *(HISTORY_BASELINES if target_history(spec) is not None else ())]


def with_history_baselines(names: Sequence[str], spec: FeatureSpec) -> list[str]:
    """``names`` (``search.baselines``), with DIN and BST added when it is the default list and
    ``spec`` has a history they read: a search on history data measures them without being asked;
    any other list, and any data without a history, is kept as it is.

    >>> from rankitect.space.testing import tiny_spec
    >>> spec = tiny_spec(history=4)
    >>> with_history_baselines(DEFAULT_BASELINES, spec)[-2:], with_history_baselines(["dlrm"], spec)
    (['din', 'bst'], ['dlrm'])
    """
    if tuple(names) != DEFAULT_BASELINES or target_history(spec) is None:
        return list(names)
    return [*names, *HISTORY_BASELINES]


def get_baseline(name: str, spec: FeatureSpec, *, embedding_dim: int = 16) -> Architecture:
    """The baseline ``name`` (a key of :data:`BASELINES` or :data:`HISTORY_BASELINES`) for data
    described by ``spec``.

    >>> from rankitect.space.testing import tiny_spec
    >>> arch = get_baseline("dcnv2", tiny_spec())
    >>> arch.blocks[0].op, engineer_space_for(tiny_spec()).contains(arch)
    ('dcn', True)
    """
    known = {**BASELINES, **HISTORY_BASELINES}
    if name not in known:
        raise ValueError(f"unknown baseline {name!r}; known: {sorted(known)}")
    return known[name](spec, embedding_dim)


def history_options(spec: FeatureSpec) -> dict[str, object]:
    """The ``engineer`` options that route ``spec``'s history (its first sequence feature; a
    history that shares no table gets the choices that need no candidate item); ``{}`` without one."""
    if not spec.sequence:
        return {}
    f = next((f for f in spec.sequence if f.shares is not None), spec.sequence[0])
    ops = tuple(HISTORY_OPS) if f.shares is not None else ("none", "pool")
    return {"history": f.name, "history_ops": ops}


def engineer_space_for(spec: FeatureSpec, *, embedding_dim: int = 16) -> SearchSpace:
    """The ``engineer`` space that holds the baselines for ``spec`` (dense parts only if it has any,
    history choices only if it has a history)."""
    return get_space("engineer", embedding_dim=embedding_dim, use_dense=spec.n_dense > 0, **history_options(spec))
