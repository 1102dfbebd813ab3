"""rankitect.blocks: the building blocks of ranking models and their one registry.

Importing this package registers every block in :data:`BLOCKS`. A block module holds everything
about its op (forward, FLOPs, ROCS split forward, supernet slicing rule, typed params; see
:mod:`rankitect.blocks.base`) and imports only torch, the standard library and the shared pieces
here (:mod:`~rankitect.blocks.common` layers, :mod:`~rankitect.blocks.split` maps on ROCS splits,
:mod:`~rankitect.blocks.slicing` weight cuts), so that the exporter can copy it into ``model.py``.
"""

from rankitect.blocks import attention, dcn, dhen, dot, efc, fm, gating, mlp, sum_block, wukong
from rankitect.blocks.base import BLOCKS, FIELD, FLAT, Block, block_params, build_block, register_block

__all__ = [
    "BLOCKS",
    "FIELD",
    "FLAT",
    "Block",
    "attention",
    "block_params",
    "build_block",
    "dcn",
    "dhen",
    "dot",
    "efc",
    "fm",
    "gating",
    "mlp",
    "register_block",
    "sum_block",
    "wukong",
]
