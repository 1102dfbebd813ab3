"""rankitect.blocks: the building blocks of ranking models and their one registry.

Importing this package registers every block in :data:`BLOCKS`. A block module holds everything
about its op (forward, FLOPs, ROCS split forward, supernet slicing rule, typed params; see
:mod:`rankitect.blocks.base`) and imports only torch, the standard library and the shared pieces
here (:mod:`~rankitect.blocks.common` layers, :mod:`~rankitect.blocks.split` maps on ROCS splits,
:mod:`~rankitect.blocks.slicing` weight cuts), so that the exporter can copy it into ``model.py``.

Every module of this package is imported here, so a new op is one new file (plus its test): its
``@register_block`` runs on import, with no list to extend.
"""

import importlib
import pkgutil

from rankitect.blocks.base import BLOCKS, FIELD, FLAT, Block, block_params, build_block, register_block

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "BLOCKS",
    "FIELD",
    "FLAT",
    "Block",
    "block_params",
    "build_block",
    "register_block",
]
