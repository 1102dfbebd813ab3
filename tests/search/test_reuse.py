"""Baselines paid once: a second search on the same data, recipe, seed and protocol reuses them."""

from __future__ import annotations

import numpy as np
import pytest

from rankitect.config import load_config
from rankitect.search.running.runner import SearchRunner

from tests.learnable import learnable_source
from .test_runner import _children, _client

TINY = [f"data.source={learnable_source()}", "train.max_epochs=2", "train.batch_size=64", "train.val_batches=2",
        "train.test_batches=2", "runtime.threads=1", "search.workers=1", "search.strategy=random",
        "search.trials=1", "search.baselines=[dlrm,deepfm]", "search.pruning=asha"]


def _search(*extra: str, lines: list[str] | None = None) -> tuple[SearchRunner, object]:
    runner = SearchRunner(load_config(overrides=[*TINY, *extra]), echo=(lines if lines is not None else []).append)
    return runner, runner.run()


def _baselines(parent: str) -> dict[str, object]:
    return {r.info.run_name: r for r in _children(parent) if r.data.tags["rankitect.kind"] == "baseline"}


@pytest.mark.slow
def test_a_second_search_on_the_same_data_reuses_every_baseline(env, monkeypatch: pytest.MonkeyPatch) -> None:
    import rankitect.search.running.trial as trial

    first_lines: list[str] = []
    first, one = _search(lines=first_lines)
    trained: list[str] = []
    real = trial.run_trial

    def counting(arch, *args, **kwargs):
        trained.append(arch.hash)
        return real(arch, *args, **kwargs)

    monkeypatch.setattr(trial, "run_trial", counting)
    lines: list[str] = []
    second, two = _search("search.seed=1", lines=lines)  # another strategy seed: the baselines are the same
    before, after = _baselines(one.parent_run_id), _baselines(two.parent_run_id)
    from rankitect.space.baselines import get_baseline

    assert sorted(after) == ["deepfm", "dlrm"] and trained  # candidates trained, no baseline
    assert not {get_baseline(n, second.data.spec).hash for n in after} & set(trained)
    for name, run in after.items():
        assert run.data.tags["rankitect.reused_from"] == before[name].info.run_id
        assert any(line.startswith(f"[baseline] {name}: reused from run {before[name].info.run_id}") for line in lines)
        for metric in ("val/ne", "test/ne", "mflops"):
            assert run.data.metrics[metric] == pytest.approx(before[name].data.metrics[metric])
        assert "model/model.safetensors" in {f.path for f in _client().list_artifacts(run.info.run_id, "model")}
        for store in (first.standings.val_losses, first.standings.held["verdict"]):  # the paired losses came along
            kind = store.folder.name
            again = second.standings.val_losses if kind == "val_losses" else second.standings.held["verdict"]
            np.testing.assert_array_equal(again.load(name), store.load(name))
    rung = lambda out: [line for line in out if line.startswith(("pruning_min_validations auto",  # noqa: E731
                                                                  "pruning_early_rung auto"))]
    assert rung(lines) == rung(first_lines) and len(rung(lines)) == 2  # the same rungs, from the same curves
    assert "reused from a search without one" not in rung(lines)[1]  # the probes came along
    spent = two.spending
    assert spent["baselines"] == 0.0  # no baseline time spent in the second search


@pytest.mark.slow
@pytest.mark.parametrize("change", ["train.seed=1", "search.reuse_baselines=false", "search.verdict.fraction=0.3"])
def test_another_seed_protocol_or_a_refusal_trains_the_baselines_again(env, change: str) -> None:
    _, one = _search()
    _, two = _search(change)
    for run in _baselines(two.parent_run_id).values():
        assert "rankitect.reused_from" not in run.data.tags
