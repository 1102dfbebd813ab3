"""A small click data set that models learn within an epoch, for end-to-end tests.

The synthetic default needs about 10^4 rows before any model beats the base rate (its id
vocabularies reach 100 000), and a model that does not beat it is an honestly failed trial. End-to-
end tests whose models must count as trained read this data set instead: the tiny feature spec
(small vocabularies) with a planted logistic teacher, 2048 rows per split, 32 steps of 64 rows an
epoch. It is written once per test process into a temporary folder; pass
``data.source=<learnable_source()>``.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from .search.tiny_data import tiny_click_data

ROWS = 2048


@functools.lru_cache(maxsize=None)
def learnable_source() -> str:
    folder = Path(tempfile.mkdtemp(prefix="rankitect-learnable-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    tiny_click_data(folder / "data", rows=ROWS)
    return str(folder / "data")
