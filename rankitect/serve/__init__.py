"""rankitect.serve: scoring ROCS-masked models with the request-side work done once per request.

>>> from rankitect.serve import score_requests, rocs_flops  # the entry points
"""

from rankitect.serve.rocs import RocsCost, request_rows, rocs_cost, rocs_flops, score_requests, split_logits
from rankitect.blocks.split import Split

__all__ = ["RocsCost", "Split", "request_rows", "rocs_cost", "rocs_flops", "score_requests", "split_logits"]
