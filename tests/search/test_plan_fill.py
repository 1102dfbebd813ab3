"""Without a time budget, the supernet strategies train ``search.trials`` candidates like every other.

What the supernet chose comes first (trained in full); the rest come from the climb (dnas: one-choice
changes of the best trained architecture; oneshot: the next best scored children, then mutations).
"""

from __future__ import annotations

import pytest

from rankitect.config import load_config
from rankitect.space import get_space
from tests.learnable import learnable_source
from tests.space.conftest import SMALL_NASREC

N = 3
TINY = [
    f"data.source={learnable_source()}", "train.max_epochs=1", "train.batch_size=64", "train.val_batches=2",
    "train.test_batches=2", "train.progress=false", "runtime.threads=1", "search.workers=1", "search.space=nasrec",
    "search.flops_range=null", "search.baselines=[dlrm]", "search.pruning=none", f"search.trials={N}",
    "search.dnas.supernet.steps=12", "search.dnas.weights_only_steps=4", "search.oneshot.supernet.steps=12",
    "search.oneshot.widest_decay_steps=4", "search.oneshot.population=1", "search.oneshot.sample_size=1",
    "search.oneshot.children=1", "search.oneshot.finetune_batches=1", "search.oneshot.finetune_steps=2",
    "search.oneshot.score_batches=2",
]


@pytest.mark.parametrize("strategy", ["dnas", "oneshot"])
def test_without_a_time_budget_a_supernet_search_trains_search_trials_candidates(
        strategy: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from rankitect.search.running.runner import SearchRunner

    monkeypatch.setattr("rankitect.search.proposing.sizing.get_space", lambda name, **kw: get_space(
        name, **{**SMALL_NASREC, "num_blocks": 2}))
    lines: list[str] = []
    cfg = load_config(overrides=[*TINY, f"search.strategy={strategy}"])
    assert cfg.search.time_budget is None and getattr(cfg.search, strategy).supernet.top_k == 1
    outcome = SearchRunner(cfg, echo=lines.append).run()
    candidates = outcome.table[outcome.table["kind"] == "candidate"]
    assert len(candidates) == N and candidates["name"].is_unique
    # the supernet's own choice is the first retrained; the others follow it
    first = next(i for i, line in enumerate(lines) if "retraining" in line)
    assert "a change of" not in lines[first] and "a mutation of" not in lines[first]
    if strategy == "dnas":
        assert sum("a change of" in line for line in lines) == N - 1
    else:  # 2 paths scored (dlrm lies outside nasrec): at most 2 children to plan, then mutations
        assert any("a mutation of" in line for line in lines)
