"""``search.workers: auto``: the machine's cores used without flags, and where trials must stay in
the search's own process."""

from __future__ import annotations

import sys
import types

import pytest

from rankitect.config import load_config
from rankitect.search.running.launch import MAX_AUTO_WORKERS, worker_plan
from rankitect.search.running.trial import in_process_only, user_modules

from tests.learnable import learnable_source


@pytest.mark.parametrize(("cores", "workers", "threads"), [(1, 1, 1), (2, 2, 1), (3, 3, 1), (8, 4, 2), (64, 4, 16)])
def test_auto_is_one_worker_per_core_and_shares_the_cores_out(cores: int, workers: int, threads: int) -> None:
    plan = worker_plan("auto", 0, cores=cores)
    assert (plan.workers, plan.threads) == (workers, threads)
    assert plan.workers == min(cores, MAX_AUTO_WORKERS) and plan.workers * plan.threads <= cores


def test_numbers_given_are_kept() -> None:
    assert worker_plan(1, 0, cores=8) == worker_plan(1, 8, cores=2)  # one process: every core for torch
    assert worker_plan(3, 2, cores=2).threads == 2
    with pytest.raises(ValueError, match="search.workers must be >= 1 or 'auto', got 0"):
        worker_plan(0, 0, cores=2)


def test_a_main_program_no_worker_can_import_keeps_trials_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from rankitect.blocks.base import BLOCKS, Block

    assert in_process_only() is None  # pytest's own main module is a file
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    assert in_process_only() is None  # a notebook that registered nothing of its own
    sys.modules["__main__"].__file__ = "<stdin>"
    assert "'<stdin>' is no file a worker process can import" in in_process_only()
    del sys.modules["__main__"].__file__

    class Mine(Block):  # registered from a notebook cell
        pass

    Mine.__module__ = "__main__"
    BLOCKS.add("mine_in_main", Mine)
    try:
        assert "registered in __main__" in in_process_only()
        assert "__main__" not in user_modules()
    finally:
        BLOCKS.pop("mine_in_main")


def test_a_search_from_stdin_trains_in_its_own_process_and_says_so(env, monkeypatch: pytest.MonkeyPatch) -> None:
    from rankitect.search.running.runner import SearchRunner

    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    sys.modules["__main__"].__file__ = "<stdin>"
    lines: list[str] = []
    cfg = load_config(overrides=[f"data.source={learnable_source()}", "search.workers=2", "search.trials=1",
                                 "search.baselines=[]", "search.strategy=random", "train.max_epochs=1",
                                 "train.batch_size=64", "runtime.threads=1"])
    runner = SearchRunner(cfg, echo=lines.append)
    assert runner.plan.workers == 1
    assert any(line.startswith("trials run in this process, not in 2 workers: the main program") for line in lines)
    assert runner.run().table["status"].tolist() == ["ok"]
