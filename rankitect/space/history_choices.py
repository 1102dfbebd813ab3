"""The history choices of a space: which history block reads the data's history, and its knobs.

A space built for data with a history (``history=<sequence feature>``) gains::

    history.op                  none | pool | target | transformer | cross
    history.path                top | fields   (where the block's output goes; see the preset)
    history.pool.mode           mean | sum                  (pool: history_pool)
    history.target.width        the DIN MLP's first width   (target: target_attention)
    history.transformer.heads   attention heads             (transformer: history_transformer)
    history.cross.heads         attention heads             (cross: history_cross, ROCS DCA)
    history.cross.encoder       False | True: a self-attention encoder before the keys and values

Only the knobs of the chosen op are read (active). A space without a history has none of these
labels, so its choices, samples and genotypes are those it had before histories existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rankitect.space.architecture import BlockGene, history_name, history_ref
from rankitect.space.space import Choice

# Label of each option -> the block op it builds (None: no history block).
HISTORY_OPS: dict[str, str | None] = {
    "none": None, "pool": "history_pool", "target": "target_attention", "transformer": "history_transformer",
    "cross": "history_cross",
}
TARGET_OPS = ("target", "transformer", "cross")  # read the candidate item: need a history sharing its table
PATHS = ("top", "fields")
# Knobs per option: label suffix -> block param.
KNOBS: dict[str, dict[str, str]] = {
    "pool": {"mode": "mode"}, "target": {"width": "width"}, "transformer": {"heads": "num_heads"},
    "cross": {"heads": "num_heads", "encoder": "encoder"},
}


class HistoryChoices:
    """The history part of a space: the sequence feature ``name``, the ``ops`` menu (labels of
    :data:`HISTORY_OPS`) and the ``widths`` menu of target attention.

    >>> h = HistoryChoices("clicks", ("none", "target"), (20, 40))
    >>> [c.label for c in h.choices(heads=(1, 2))]
    ['history.op', 'history.path', 'history.target.width']
    >>> h.decode({"history.op": "target", "history.target.width": 40}).inputs
    ('history:clicks',)
    """

    def __init__(self, name: str, ops: Sequence[str], widths: Sequence[int]) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"option 'history' must name a sequence feature, got {name!r}")
        unknown = [op for op in ops if op not in HISTORY_OPS]
        if unknown or not ops:
            raise ValueError(f"option 'history_ops': {unknown or list(ops)} not among {list(HISTORY_OPS)}")
        self.name, self.ops, self.widths = name, tuple(ops), tuple(widths)

    def options(self) -> dict[str, Any]:
        return {"history": self.name, "history_ops": self.ops, "history_widths": self.widths}

    def choices(self, heads: Sequence[int]) -> list[Choice]:
        menus = {"mode": ("mean", "sum"), "width": self.widths, "heads": tuple(heads), "encoder": (False, True)}
        out = [Choice("history.op", self.ops), Choice("history.path", PATHS)]
        for op in self.ops:
            out += [Choice(f"history.{op}.{suffix}", menus[suffix]) for suffix in KNOBS.get(op, {})]
        return out

    def decode(self, s: Mapping[str, Any]) -> BlockGene | None:
        """The history gene of sample ``s`` (``None`` for ``none``)."""
        op = s["history.op"]
        if HISTORY_OPS[op] is None:
            return None
        params = {param: s[f"history.{op}.{suffix}"] for suffix, param in KNOBS[op].items()}
        return BlockGene(HISTORY_OPS[op], (history_ref(self.name),), params)

    def encode(self, gene: BlockGene | None) -> dict[str, Any]:
        """The labels of a gene that may be the history gene (``history.op = none`` when it is not)."""
        if gene is None or len(gene.inputs) != 1 or history_name(gene.inputs[0]) != self.name:
            return {"history.op": "none"}
        op = next(label for label, name in HISTORY_OPS.items() if name == gene.op)
        knobs = {f"history.{op}.{suffix}": gene.params[param] for suffix, param in KNOBS[op].items()}
        return {"history.op": op, **knobs}


__all__ = ["HISTORY_OPS", "KNOBS", "PATHS", "TARGET_OPS", "HistoryChoices"]
