"""The verdict: the final choice on validation rows held out from everything else the search does.

Unit tests plant per-example losses and check the choice and its numbers against hand arithmetic
(numpy means and standard deviations); the end-to-end tests check that a search holds the rows
out, that only the scoring at a training's end reads them, and what it records."""

from __future__ import annotations

import json
import math
import traceback

import numpy as np
import pytest

from rankitect.config import load_config
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.judging.selection import Entrant
from rankitect.search.judging.verdict import judge

from tests.learnable import learnable_source

H = 0.5  # label entropy of the planted held-out rows (nats)


def _e(name: str, kind: str, val_ne: float, mflops: float = 1.0) -> Entrant:
    return Entrant(name, kind, TrialResult(val_ne=val_ne, test_ne=val_ne, mflops=mflops))


@pytest.fixture()
def base() -> np.ndarray:
    return np.random.default_rng(0).exponential(0.5, 5_000)


def test_a_candidate_best_on_validation_only_does_not_replace_the_baseline(base) -> None:
    rng = np.random.default_rng(1)
    held = {"dlrm": base, "aaaa": base + 0.002 + rng.normal(0.0, 0.05, len(base))}  # worse on the held-out rows
    v = judge([_e("dlrm", "baseline", 0.80), _e("aaaa", "candidate", 0.70)], held, Objective(), entropy=H)
    assert v.pick.winner.name == "aaaa"  # the validation rule alone would return it
    assert v.winner.name == "dlrm" and v.held_out and v.rows == len(base)
    judged = v.judged(v.finalists[0].entrant)
    d = (base - held["aaaa"]) / H  # the paired differences, by hand
    assert judged.gain == pytest.approx(d.mean()) and judged.se == pytest.approx(d.std(ddof=1) / math.sqrt(len(d)))
    assert judged.z < 1.0
    first = v.lines(1.0)[0]
    assert first.startswith("winner dlrm (baseline;") and "5,000 held-out validation rows" in first
    assert "none is better there by more than 1 standard error" in first


def test_a_finalist_better_on_the_held_out_rows_wins_with_that_gain(base) -> None:
    held = {"dlrm": base, "aaaa": base - 0.01, "bbbb": base - 0.03}
    v = judge([_e("dlrm", "baseline", 0.80), _e("aaaa", "candidate", 0.78), _e("bbbb", "candidate", 0.79)],
              held, Objective(), entropy=H)
    assert v.winner.name == "bbbb" and [j.entrant.name for j in v.finalists] == ["aaaa", "bbbb"]
    won = v.judged(v.winner)
    assert won.gain == pytest.approx(0.03 / H) and won.ne == pytest.approx(np.mean(base - 0.03) / H)
    assert v.incumbent_ne == pytest.approx(np.mean(base) / H)
    assert "chosen on 5,000 held-out validation rows" in v.lines(1.0)[0]
    pct = f"{-100 * won.gain / v.incumbent_ne:+.2f}%"
    assert f"objective {pct}" in v.lines(1.0)[0]  # the printed gain is the held-out rows' own


def test_only_the_best_finalists_by_validation_are_judged(base) -> None:
    noise = np.random.default_rng(2).normal(0.0, 0.05, len(base))
    held = {"dlrm": base, "aaaa": base + 0.002 + noise, "bbbb": base - 0.05 + noise}  # bbbb: second on validation
    entrants = [_e("dlrm", "baseline", 0.80), _e("aaaa", "candidate", 0.70), _e("bbbb", "candidate", 0.75)]
    one = judge(entrants, held, Objective(), entropy=H, finalists=1)
    two = judge(entrants, held, Objective(), entropy=H, finalists=2)
    assert [j.entrant.name for j in one.finalists] == ["aaaa"] and one.winner.name == "dlrm"
    assert two.winner.name == "bbbb"


def test_a_candidate_worse_on_validation_or_without_held_out_losses_is_no_finalist(base) -> None:
    held = {"dlrm": base, "aaaa": base - 0.05}  # cccc has none (a checkpoint from before)
    entrants = [_e("dlrm", "baseline", 0.80), _e("aaaa", "candidate", 0.81), _e("cccc", "candidate", 0.70)]
    v = judge(entrants, held, Objective(), entropy=H)
    assert v.finalists == () and v.winner.name == "dlrm"
    assert "no candidate has a lower validation objective" in v.lines(1.0)[0]


def test_without_held_out_rows_the_validation_rule_decides(base) -> None:
    entrants = [Entrant("dlrm", "baseline", TrialResult(val_ne=0.80, test_ne=0.8, mflops=1.0), base),
                Entrant("aaaa", "candidate", TrialResult(val_ne=0.70, test_ne=0.7, mflops=1.0), base - 0.05 * H)]
    v = judge(entrants, {}, Objective(), entropy=None)
    assert not v.held_out and v.winner.name == "aaaa" == v.pick.winner.name
    assert "no rows held out for the verdict" in v.lines(1.0)[-1]


def test_the_flops_penalty_weighs_each_finalist_on_the_held_out_rows(base) -> None:
    # 4x the target (2 doublings, weight 0.05: k = 1.1) for 5% lower loss: 1.1 * 0.95 > 1, worse
    obj = Objective(target_mflops=1.0, weight=0.05)
    held = {"dlrm": base, "aaaa": base * 0.95}
    v = judge([_e("dlrm", "baseline", 0.80), _e("aaaa", "candidate", 0.70, mflops=4.0)], held, obj, entropy=H)
    j = v.finalists[0]
    assert j.gain == pytest.approx(np.mean(base - 1.1 * 0.95 * base) / H) and j.gain < 0
    assert v.winner.name == "dlrm"


def test_carving_holds_out_whole_requests_the_same_way_every_time(tmp_path) -> None:
    from rankitect.data.clickdata import ClickData

    data = ClickData.open(learnable_source())
    carved, again = data.with_verdict(0.5), ClickData.open(learnable_source()).with_verdict(0.5)
    val, kept, held = data.split("val"), carved.split("val"), carved.split("verdict")
    assert len(kept) + len(held) == len(val) and len(held) > 0.3 * len(val)
    ids = lambda s: set(np.asarray(s.request_ids).tolist())  # noqa: E731
    assert not ids(kept) & ids(held) and ids(kept) | ids(held) == ids(val)
    np.testing.assert_array_equal(held.request_ids, again.split("verdict").request_ids)
    np.testing.assert_array_equal(held.labels, again.split("verdict").labels)
    assert held.stats["positives"] == int(np.asarray(held.labels).sum()) and held.n_requests == len(ids(held))
    assert data.with_verdict(0.0) is data and not data.has_verdict
    assert carved.split("train") is not None and len(carved.split("test")) == len(data.split("test"))


def test_carving_keeps_each_row_with_its_history(tmp_path) -> None:
    from rankitect.data import open_data

    data = open_data("synthetic-categorical", rows=3000, history=5, cache_dir=tmp_path)
    val, held = data.split("val"), data.with_verdict(0.5).split("verdict")
    row_of = {int(r): i for i, r in enumerate(np.asarray(val.request_ids))}  # a request's first row in val
    first = np.unique(np.asarray(held.request_ids), return_index=True)[1]
    for j in first:  # every held-out request: its history as the validation split holds it
        i = row_of[int(held.request_ids[j])]
        for name, (ids, lengths) in held.history.items():
            np.testing.assert_array_equal(ids[j], val.history[name][0][i])
            assert lengths[j] == val.history[name][1][i]
    batch = next(iter(held.batches(64, shuffle=False)))
    assert batch.history is not None and len(batch) == min(64, len(held))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_search_holds_the_rows_out_and_judges_on_them(env, monkeypatch, workers: int) -> None:
    import rankitect.data.clickdata as clickdata
    from rankitect.search.running.runner import SearchRunner
    from tests.search.test_runner import _children

    readers: list[str] = []
    real = clickdata.ClickData.split

    def watched(self, name):  # who reads the held-out rows in this process
        if name == "verdict":
            readers.append("".join(traceback.format_stack(limit=8)))
        return real(self, name)

    monkeypatch.setattr(clickdata.ClickData, "split", watched)
    cfg = load_config(overrides=[f"data.source={learnable_source()}", "train.max_epochs=2", "train.batch_size=64",
                                 "runtime.threads=1", f"search.workers={workers}", "search.trials=3",
                                 "search.strategy=random", "search.baselines=[dlrm,deepfm]", "search.pruning=none"])
    runner = SearchRunner(cfg, echo=lambda s: None)
    outcome = runner.run()
    read = list(readers)  # by the search (the checks below read the rows too)
    held_rows, val_rows = len(runner.data.split("verdict")), len(runner.data.split("val"))
    ok = outcome.table[outcome.table["status"] == "ok"]
    for name in ok["name"]:  # every ok trial scored once on the held-out rows, apart from validation
        assert len(runner.standings.held["verdict"].load(name)) == held_rows
        assert len(runner.standings.val_losses.load(name)) == val_rows
    # in this process: the held-out rows' label entropy when the search opens, then (trials in this
    # process) only the scoring at each training's end
    assert sum("in held_out_losses" in r for r in read) == (len(ok) if workers == 1 else 0)
    assert all("in held_out_losses" in r or "in _open" in r for r in read)
    record = json.loads((outcome.out_dir / "verdict.json").read_text())
    assert record["rows"] == held_rows and record["winner"] == outcome.table.loc[outcome.table["winner"], "name"].item()
    clicks = sum(int(b.labels.sum()) for b in runner.data.split("verdict").batches(4096, shuffle=False))
    assert record["clicks"] == clicks > 0  # what the verdict's error rests on, counted from the labels
    assert record["incumbent"] in set(ok[ok["kind"] == "baseline"]["name"])
    runs = {r.info.run_name: r for r in _children(outcome.parent_run_id)}
    judged = [record["incumbent"], *(f["name"] for f in record["finalists"])]
    for r in runs.values():
        name = r.data.tags.get("genotype_hash") if r.data.tags["rankitect.kind"] == "candidate" else r.info.run_name
        assert ("verdict/ne" in r.data.metrics) == (name in judged)
    if record["finalists"]:  # judged on the held-out rows: the closing line says so
        assert f"{held_rows:,} held-out validation rows ({clicks:,} clicks;" in outcome.verdict.lines(1.0)[0]


def test_a_training_scores_the_held_out_and_test_rows_it_never_saw() -> None:
    import torch

    from rankitect.config import TrainConfig
    from rankitect.data.clickdata import ClickData
    from rankitect.space.baselines import get_baseline
    from rankitect.train.loop import train_architecture

    data = ClickData.open(learnable_source()).with_verdict(0.5)
    cfg = TrainConfig(batch_size=64, max_epochs=1, progress=False)
    out = train_architecture(get_baseline("dlrm", data.spec), data, cfg)
    assert not any(k.startswith("verdict") for k in out.metrics)  # nothing a strategy is told
    for split, losses in (("verdict", out.verdict_losses), ("test", out.test_losses)):
        naive = []
        with torch.no_grad():
            out.model.eval()
            for batch in data.split(split).batches(64, shuffle=False):
                for z, y in zip(out.model(batch).reshape(-1).tolist(), batch.labels.tolist()):
                    naive.append(math.log1p(math.exp(z)) - y * z)  # log(1 + e^z) - y z
        assert len(losses) == len(data.split(split)) and np.allclose(losses, naive, atol=1e-5)
    assert train_architecture(get_baseline("dlrm", data.spec), ClickData.open(learnable_source()),
                              cfg).verdict_losses is None
