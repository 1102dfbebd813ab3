"""The README's Python examples run as written: a notebook search, a custom block, a custom space."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEARCH_OWN_SPACE = '''
cfg = load_config(overrides=["search.space=two_layer", "search.strategy=random", "search.trials=1",
                             "search.baselines=[]", "search.pruning=none", "data.rows=8000",
                             "train.batch_size=128", "train.max_epochs=2", "train.grace_steps=50",
                             "runtime.threads=1", "search.workers=1"])
own = SearchRunner(cfg).run()
assert set(own.table["status"]) == {"ok"}, own.table
assert all(a.blocks[0].op == "scaled_linear" for a in [own.best])
assert outcome.best is not None and outcome.table["winner"].sum() == 1
'''


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path: Path) -> None:
    blocks = [b for b in _python_blocks() if "load_scorer" not in b]  # the export one: tests/export
    assert len(blocks) == 3, "the notebook search, the custom block and the custom space"
    script = "\n\n".join(blocks) + SEARCH_OWN_SPACE
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANKITECT_DATA_DIR": str(tmp_path / "data")}
    env.pop("MLFLOW_TRACKING_URI", None)
    # run as a notebook runs it (python -c): no script file for the search's workers to import again
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "winner" in done.stdout
