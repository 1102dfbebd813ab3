"""Where the tests find the shared real data: ``shared/`` beside the checkout (as CI lays it out)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = (ROOT.parent / "shared", ROOT / "shared", Path("/work/shared"))
SHARED = next((p for p in _CANDIDATES if (p / "data").is_dir()), _CANDIDATES[0])
CRITEO_SAMPLE = SHARED / "data" / "criteo_sample.tsv"
