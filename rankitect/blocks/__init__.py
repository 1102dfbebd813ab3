"""rankitect.blocks: the building blocks of ranking models and their one registry.

Importing this package registers every block in :data:`BLOCKS`.
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
