"""rankitect.export: a winner as a standalone PyTorch module (one ``model.py``) plus its weights.

:func:`generate_source` writes the source, :func:`export_model` a whole directory from a
:class:`~rankitect.space.builder.RankingModel`, :func:`export_from_files` the same from a genotype,
a feature spec and a weights file (what ``rankitect export RUN_ID -o DIR`` needs).
"""

from rankitect.export.codegen import audit_source, generate_source
from rankitect.export.exporter import convert_state_dict, export_from_files, export_model, read_state_dict

__all__ = [
    "audit_source",
    "convert_state_dict",
    "export_from_files",
    "export_model",
    "generate_source",
    "read_state_dict",
]
