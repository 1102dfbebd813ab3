"""One-shot: supernet training, scoring with inherited weights against a standalone reference,
evolution determinism, the retrained winners, and the search end to end in MLflow."""

from __future__ import annotations

import math
import re
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rankitect.cli import main
from rankitect.config import DnasConfig, OneShotConfig, SupernetConfig, TrainConfig
from rankitect.data.store import ClickData
from rankitect.errors import ConfigError
from rankitect.eval.evaluate import evaluate
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from rankitect.search.strategies.oneshot import OneShotSearch, best_scored, evolve, seed_population
from rankitect.supernet.dnas_phase import dnas_schedule
from rankitect.supernet.oneshot_phase import make_scorer, oneshot_schedule, score, train_supernet
from rankitect.supernet.train import SliceAdam, SupernetTrainer, build_supernet, evaluate_path, supernet_schedule
from rankitect.space import get_space
from tests.learnable import learnable_source
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_NASREC

TRAIN = TrainConfig(batch_size=64, progress=False)
# epochs high enough that supernet.steps, not the data, sets the steps.
CFG = OneShotConfig(supernet=SupernetConfig(steps=80, epochs=100.0), widest_decay_steps=20, population=4, sample_size=2,
                    children=4, finetune_batches=2, finetune_steps=4, score_batches=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ClickData:
    return tiny_click_data(tmp_path_factory.mktemp("oneshot") / "data", rows=1024)


def space():
    return get_space("nasrec", **{**SMALL_NASREC, "num_blocks": 3})


def test_slice_adam_is_adam_on_the_cut_and_leaves_the_rest() -> None:
    gen = torch.Generator().manual_seed(0)
    wide = torch.nn.Parameter(torch.randn(6, 5, generator=gen))
    rows, cols = 4, torch.tensor([4, 0, 2])
    cut = torch.nn.Parameter(wide.detach()[:rows][:, cols].clone())  # the same sub-problem, as plain Adam sees it
    adam, sliced = torch.optim.Adam([cut], lr=0.01, weight_decay=0.1), SliceAdam(0.01, weight_decay=0.1)
    before = wide.detach().clone()
    x = torch.randn(8, 3, generator=gen)
    for _ in range(5):
        adam.zero_grad()
        (x @ cut.T).square().mean().backward()
        adam.step()
        sliced.zero_grad()
        (x @ sliced.take(wide, rows, cols).T).square().mean().backward()
        sliced.step()
    torch.testing.assert_close(wide.detach()[:rows][:, cols], cut.detach(), rtol=1e-6, atol=1e-7)
    untouched = torch.ones_like(before, dtype=torch.bool)
    untouched[:rows, cols[:, None]] = False
    assert torch.equal(wide.detach()[untouched], before[untouched])


def test_a_weight_cut_twice_in_one_step_takes_its_two_updates_in_turn() -> None:
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(6, 3, generator=gen)
    grads = [torch.randn(2, 3, generator=gen) for _ in range(2)]
    rows = [torch.tensor([0, 2]), torch.tensor([5, 1])]
    together, one_by_one = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt = SliceAdam(0.1)
    for idx, g in zip(rows, grads):  # both cuts in one step
        opt.take(together, idx, None).grad = g
    opt.step()
    ref = SliceAdam(0.1)
    for idx, g in zip(rows, grads):  # the same cuts, one step each
        ref.take(one_by_one, idx, None).grad = g
        ref.step()
    torch.testing.assert_close(together.detach(), one_by_one.detach(), rtol=0, atol=0)


def test_an_exploding_path_takes_no_step_and_a_sane_one_is_clipped(data: ClickData) -> None:
    supernet = build_supernet(space(), data.spec, 0)
    trainer = SupernetTrainer(supernet, TRAIN, data.split("train").ctr, max_ne=10.0, max_grad_norm=0.5)
    batch = next(data.split("train").batches(64, shuffle=False))
    path = space().sample(np.random.default_rng(0))
    with torch.no_grad():
        for p in supernet.head.parameters():
            p.fill_(50.0)  # logits in the thousands: NE far above 10
    before = {k: v.clone() for k, v in supernet.state_dict().items()}
    assert trainer.step(batch, path) > 10 * trainer.base_entropy
    assert trainer.skipped == 1 and all(torch.equal(v, before[k]) for k, v in supernet.state_dict().items())
    dense, rows = torch.full((3,), 4.0), torch.sparse_coo_tensor([[1]], [[3.0, 0.0]], (5, 2))
    trainer._clip([dense, rows, None])  # |(4, 4, 4, 3)| = 7.5 -> 0.5
    norm = (dense.square().sum() + rows.coalesce().values().square().sum()).sqrt()
    assert float(norm) == pytest.approx(0.5)


def test_supernet_training_improves_a_held_out_path(data: ClickData) -> None:
    supernet = build_supernet(space(), data.spec, 0)
    path = supernet.widest_path(np.random.default_rng(1))
    val = list(data.split("val").batches(256, shuffle=False))
    before = evaluate_path(supernet, path, val)["ne"]
    losses = train_supernet(supernet, data, TRAIN, CFG, seed=0)
    assert len(losses) == CFG.supernet.steps and all(np.isfinite(losses))
    assert evaluate_path(supernet, path, val)["ne"] < before


def test_score_without_fine_tune_is_the_extracted_models_ne(data: ClickData) -> None:
    supernet = build_supernet(space(), data.spec, 0)
    scorer = make_scorer(supernet, data, TRAIN, replace(CFG, finetune_steps=0))
    path = space().sample(np.random.default_rng(2))
    reference = evaluate(supernet.extract(path), data.split("val").batches(64, shuffle=False), 4)
    assert scorer(path)["ne"] == pytest.approx(reference["ne"], rel=1e-5)


def test_scoring_fine_tunes_a_copy_and_leaves_the_supernet_alone(data: ClickData) -> None:
    supernet = build_supernet(space(), data.spec, 0)
    before = {k: v.clone() for k, v in supernet.state_dict().items()}
    scorer = make_scorer(supernet, data, TRAIN, replace(CFG, finetune_steps=8))
    path = space().sample(np.random.default_rng(3))
    tuned = scorer(path)["ne"]
    untuned = make_scorer(supernet, data, TRAIN, replace(CFG, finetune_steps=0))(path)["ne"]
    assert tuned != untuned
    for k, v in supernet.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_evolution_on_inherited_weights_is_seeded(data: ClickData) -> None:
    def run() -> list[tuple[str, float]]:
        supernet = build_supernet(space(), data.spec, 0)
        train_supernet(supernet, data, TRAIN, replace(CFG, supernet=replace(CFG.supernet, steps=10)), seed=0)
        strategy = build_strategy("evolution", space(), seed=5, population=4, sample_size=2)
        scored = evolve(supernet, make_scorer(supernet, data, TRAIN, CFG), strategy, 8)
        return [(a.hash, r.val_ne) for a, r in scored]

    first = run()
    assert len(first) == 8 and len({h for h, _ in first}) == 8
    assert run() == first


def test_evolution_starts_from_the_baselines_it_is_handed(data: ClickData) -> None:
    supernet = build_supernet(space(), data.spec, 0)
    train_supernet(supernet, data, TRAIN, replace(CFG, supernet=replace(CFG.supernet, steps=10)), seed=0)
    scorer = make_scorer(supernet, data, TRAIN, CFG)
    archs = [space().decode(space().sample(np.random.default_rng(i))) for i in (11, 12)]
    strategy = build_strategy("evolution", space(), seed=5, population=2, sample_size=2)
    seeded = seed_population(supernet, scorer, strategy, archs)
    # Scored like any child, and in the population: with population 2 there is no random sample left.
    assert [(a.hash, r.val_ne) for a, r in seeded] == [(a.hash, score(supernet, scorer, a).val_ne) for a in archs]
    best = min(seeded, key=lambda ar: ar[1].val_ne)[0]
    child = evolve(supernet, scorer, strategy, 1)[0][0]
    # Both members are drawn (sample_size = population), so the child is the better one mutated: one choice
    # apart, where a uniform sample of this space differs from it in several.
    theirs, mine = space().encode(best), space().encode(child)
    assert sum(theirs.get(k) != mine.get(k) for k in set(theirs) | set(mine)) == 1
    assert seed_population(supernet, scorer, strategy, archs[:1]) == []  # already seen: not entered twice


def test_oneshot_keeps_the_baselines_its_space_holds() -> None:
    search = OneShotSearch(space(), seed=0, config=CFG)
    inside = space().decode(space().sample(np.random.default_rng(0)))
    assert search.observe(inside, TrialResult(val_ne=0.8, mflops=1.0))
    assert not search.observe(inside, TrialResult.failure("diverged"))
    assert search.first_population() == [inside] and inside.hash in search.trained


def test_the_first_population_does_not_depend_on_the_order_baselines_finish_in() -> None:
    archs = [space().decode(space().sample(np.random.default_rng(i))) for i in (21, 22, 23)]
    results = [TrialResult(val_ne=ne, mflops=1.0) for ne in (0.7, 0.9, 0.8)]
    orders = []
    for order in ([0, 1, 2], [2, 0, 1]):
        search = OneShotSearch(space(), seed=0, config=CFG)
        for i in order:
            search.observe(archs[i], results[i])
        orders.append([a.hash for a in search.first_population()])
    assert orders[0] == orders[1] == [archs[1].hash, archs[2].hash, archs[0].hash]  # worst first, best last


def test_best_scored_ranks_by_objective_and_skips_duplicates() -> None:
    archs = [space().decode(space().sample(np.random.default_rng(i))) for i in range(3)]
    results = [TrialResult(val_ne=0.80, mflops=1.0), TrialResult(val_ne=0.70, mflops=9.0),
               TrialResult(val_ne=0.75, mflops=1.0)]
    scored = list(zip(archs, results)) + [(archs[1], results[1])]
    assert [a.hash for a in best_scored(scored, Objective(), 2)] == [archs[1].hash, archs[2].hash]
    cheap = Objective(target_mflops=1.0, penalty="relaxed", weight=1.0)  # 9 MFLOPs pays 8 NE points
    assert [a.hash for a in best_scored(scored, cheap, 3)] == [archs[2].hash, archs[0].hash, archs[1].hash]


def test_a_section_given_directly_is_checked_as_a_loaded_one_is() -> None:
    """The strategy built from Python checks its section against the config's one range table."""
    cases = [(OneShotConfig(population=2, sample_size=3), "'search.oneshot.sample_size' must be <= "),
             (OneShotConfig(supernet=SupernetConfig(top_k=0)), "'search.oneshot.supernet.top_k' must be >= 1, got 0"),
             (OneShotConfig(finetune_batches=0), "'search.oneshot.finetune_batches' must be >= 1, got 0"),
             (OneShotConfig(supernet=SupernetConfig(epochs=0.0)), "'search.oneshot.supernet.epochs' must be > 0"),
             (OneShotConfig(supernet=SupernetConfig(epochs="auto")), "'search.oneshot.supernet.epochs' must be a number")]
    for config, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            OneShotSearch(space(), seed=0, config=config)


def test_schedule_is_the_fewer_of_the_steps_and_the_epochs_with_the_warmup_in_proportion() -> None:
    # 10_000 rows in batches of 64: 156 steps an epoch (the last of 80 rows), 312 in two.
    assert oneshot_schedule(OneShotConfig(supernet=SupernetConfig(steps=1000, epochs=2.0), widest_decay_steps=300),
                            10_000, 64) == (
        312, 300 * 312 // 1000)
    assert oneshot_schedule(OneShotConfig(supernet=SupernetConfig(steps=50, epochs=2.0), widest_decay_steps=10),
                            10_000, 64) == (50, 10)
    assert oneshot_schedule(OneShotConfig(supernet=SupernetConfig(epochs=1e-9)), 10_000, 64) == (1, 0)  # never no step
    dnas = DnasConfig(supernet=SupernetConfig(steps=1000, epochs=2.0), weights_only_steps=300)
    assert dnas_schedule(dnas, 10_000, 64) == supernet_schedule(1000, 300, 2.0, 10_000, 64) == (312, 93)


class Rows:
    """Collects the logged curve rows."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, float]] = {}

    def log(self, step: int, row: dict[str, float]) -> None:
        self.rows[step] = row


def test_supernet_training_runs_the_epochs_asked(data: ClickData) -> None:
    cfg = replace(CFG, supernet=SupernetConfig(steps=1000, epochs=0.5, log_every=1), widest_decay_steps=400)
    per_epoch = len(data.split("train")) // TRAIN.batch_size  # whole batches: the rows left over join the last
    steps = math.ceil(0.5 * per_epoch)
    warmup = 400 * steps // 1000
    assert 2 < warmup < steps
    curves = Rows()
    losses = train_supernet(build_supernet(space(), data.spec, 0), data, TRAIN, cfg, seed=0, curves=curves)
    assert len(losses) == steps and sorted(curves.rows) == list(range(steps))
    p = [curves.rows[s]["train/p_widest"] for s in range(steps)]
    assert p[0] == 1.0 and p[1] == pytest.approx(1 - 1 / warmup) and p[warmup:] == [0.0] * (steps - warmup)


def test_oneshot_search_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    # A small nasrec menu: the mechanics are those of any space.
    monkeypatch.setattr("rankitect.search.proposing.sizing.get_space", lambda name, **kw: get_space(
        name, **{**SMALL_NASREC, "num_blocks": 2}))
    code = main(["search", "--strategy", "oneshot", f"data.source={learnable_source()}", "train.max_epochs=1",
                 "train.batch_size=64", "search.space=nasrec", "search.flops_range=null",
                 "train.val_batches=2", "train.test_batches=2", "train.progress=false",
                 "search.oneshot.supernet.steps=12", "search.oneshot.widest_decay_steps=4", "search.oneshot.population=3",
                 "search.oneshot.sample_size=2", "search.oneshot.children=2", "search.oneshot.finetune_batches=1",
                 "search.oneshot.finetune_steps=2",
                 "search.oneshot.score_batches=2", "search.oneshot.supernet.top_k=2", "search.oneshot.supernet.log_every=4",
                 "search.trials=2",
                 "search.baselines=[dlrm]", "runtime.threads=1", "search.workers=1"])
    assert code == 0
    out = capsys.readouterr().out
    parent = out.split("MLflow search run: ")[1].split()[0]
    assert "winner " in out and "[2/2]" in out
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'")
    kinds = sorted(r.data.tags["rankitect.kind"] for r in runs)
    assert kinds == ["baseline", "candidate", "candidate", "scored", "scored", "scored", "scored", "scored",
                     "supernet"]
    supernet = next(r for r in runs if r.data.tags["rankitect.kind"] == "supernet")
    history = client.get_metric_history(supernet.info.run_id, "train/loss")
    assert [m.step for m in history] == [0, 4, 8, 11]
    scored = {r.data.tags["genotype_hash"]: r for r in runs if r.data.tags["rankitect.kind"] == "scored"}
    for r in runs:
        if r.data.tags["rankitect.kind"] == "candidate":
            assert r.data.tags["genotype_hash"] in scored  # a retrained winner was scored first
            if r.info.status == "FINISHED":  # 100 steps on 3000 rows: a retraining may also diverge
                assert {"test/ne", "test/auc", "val/ne"} <= set(r.data.metrics)
    assert all("val/ne" in r.data.metrics and "test/ne" not in r.data.metrics for r in scored.values())
