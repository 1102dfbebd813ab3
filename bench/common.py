"""What the benches share: where the repository and the shared real data are, and one way to parse
arguments with a ``--quick`` mode.

``--quick`` runs a bench at the smallest size that still goes through every part of it (a few
seconds for most): what ``tests/test_bench.py`` runs, so a bench that no longer runs fails CI. Its
numbers mean nothing; the defaults are the measurement.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_SHARED = (ROOT.parent / "shared", ROOT / "shared")
SHARED_DATA = next((p for p in _SHARED if (p / "data").is_dir()), _SHARED[0]) / "data"
"""``shared/data`` beside the checkout (adult.csv and its schema, the Criteo sample), as CI lays it out."""


def parse_args(parser: argparse.ArgumentParser, quick: Mapping[str, Any],
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser``'s arguments, plus ``--quick``: with it, ``quick`` replaces the defaults (options
    given on the command line still win)."""
    parser.add_argument("--quick", action="store_true",
                        help="the smallest run through every part (seconds; for CI, not a measurement): "
                             + ", ".join(f"{k.replace('_', '-')}={v}" for k, v in quick.items()))
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)
