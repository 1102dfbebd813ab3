"""The surrogate: its ridge fit against least squares, a planted better change ranked first, pruned
curves read as worse evidence, and strategies guided by it deterministic and resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rankitect.config import SurrogateConfig
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search import build_strategy
from rankitect.search.proposing.surrogate import Guide, RidgeEnsemble
from rankitect.space import get_space
from tests.search.toy import ToySpace, toy_result

PLANTED_LABEL, PLANTED_OPTION, PLANTED_GAIN = "b0.flat", "dot", 0.03


def space():
    return get_space("nasrec", num_blocks=2, widths=(16, 32), tokens=(4, 8))


def planted_ne(space, arch, rng: np.random.Generator) -> float:
    """A synthetic objective over the choices: one option is ``PLANTED_GAIN`` better, a wider first
    block a little better, plus noise."""
    sample = space.encode(arch)
    ne = 0.80 - PLANTED_GAIN * (sample[PLANTED_LABEL] == PLANTED_OPTION) - 0.002 * (sample["b0.width"] == 32)
    return float(ne + rng.normal(0.0, 0.003))


def test_ridge_matches_weighted_least_squares_with_the_penalty_as_extra_rows():
    """Weighted ridge with a free intercept, against lstsq on rows ``sqrt(w)[1, x] -> sqrt(w) y`` plus
    ``sqrt(ridge) e_j -> 0`` (the textbook augmented form)."""
    rng = np.random.default_rng(0)
    X, y, w, ridge = rng.normal(size=(12, 5)), rng.normal(size=12), rng.uniform(0.5, 2.0, size=12), 0.7
    model = RidgeEnsemble(ridge=ridge, members=1)
    model.fit(X, y, w, rng_seed=[0])
    counts = np.bincount(np.random.default_rng([0, 0]).integers(12, size=12), minlength=12)  # member 0's bootstrap
    ww = w * counts
    A = np.vstack([np.sqrt(ww)[:, None] * np.hstack([np.ones((12, 1)), X]),
                   np.hstack([np.zeros((5, 1)), np.sqrt(ridge) * np.eye(5)])])
    b = np.concatenate([np.sqrt(ww) * y, np.zeros(5)])
    coef = np.linalg.lstsq(A, b, rcond=None)[0]
    beta, intercept = model.coefs[0]
    np.testing.assert_allclose(beta, coef[1:], atol=1e-10)
    assert intercept == pytest.approx(coef[0], abs=1e-10)


def fresh_candidates(s, rng: np.random.Generator, n: int = 8) -> list:
    """``n`` random architectures, exactly one of which holds the planted option, in random order."""
    fresh = []
    while len(fresh) < n:
        arch = s.decode(s.sample(rng))
        if (s.encode(arch)[PLANTED_LABEL] == PLANTED_OPTION) == (not fresh):
            fresh.append(arch)
    rng.shuffle(fresh)
    return fresh


def trained_guide(s, seed: int, kappa: float, trials: int = 60) -> tuple[Guide, np.random.Generator]:
    """A guide that observed ``trials`` random architectures: about one per feature column (the
    space's recipe choices are half of its columns, none of which the planted objective reads)."""
    rng = np.random.default_rng(seed)
    guide = Guide(s, seed=seed, candidates=8, kappa=kappa, min_trials=4)
    for _ in range(trials):  # random samples, trained
        arch = s.decode(s.sample(rng))
        guide.observe(arch, TrialResult(val_ne=planted_ne(s, arch, rng), mflops=1.0))
    return guide, rng


@pytest.mark.parametrize("seed", range(5))
def test_the_surrogate_ranks_a_planted_better_change_first(seed):
    s = space()
    guide, rng = trained_guide(s, seed, kappa=0.0)  # by the predicted mean alone
    for _ in range(5):
        fresh = fresh_candidates(s, rng)
        chosen = fresh[guide.choose(fresh, Objective())]
        assert s.encode(chosen)[PLANTED_LABEL] == PLANTED_OPTION
        mean, _ = guide.predict([chosen])
        assert guide.predictions[chosen.hash][0] == pytest.approx(float(mean[0]))


def test_exploring_by_the_spread_still_mostly_trains_the_planted_change():
    """With the default lower confidence bound (kappa 1) a candidate whose options were seldom tried
    may win now and then, but the planted change wins the great majority of draws."""
    s = space()
    chosen = []
    for seed in range(5):
        guide, rng = trained_guide(s, seed, kappa=SurrogateConfig().kappa)
        for _ in range(5):
            fresh = fresh_candidates(s, rng)
            chosen.append(s.encode(fresh[guide.choose(fresh, Objective())])[PLANTED_LABEL] == PLANTED_OPTION)
    assert np.mean(chosen) >= 0.85  # one in eight by chance


def test_a_pruned_curve_is_read_as_a_worse_ne_by_the_training_it_missed():
    """Pruned trials stopped at a third of the steps report a 0.05 worse NE than they would reach;
    the surrogate predicts the fully trained NE, not the average of both kinds."""
    s = space()
    rng = np.random.default_rng(0)
    guide = Guide(s, seed=0, min_trials=4)
    for i in range(40):
        arch = s.decode(s.sample(rng))
        ne = planted_ne(s, arch, rng)
        if i % 2:
            guide.observe(arch, TrialResult.pruning("rung 0", val_ne=ne + 0.05, mflops=1.0, params=1,
                                                    train_seconds=1.0, steps=100))
        else:
            guide.observe(arch, TrialResult(val_ne=ne, mflops=1.0, steps=300))
    fresh = [s.decode(s.sample(rng)) for _ in range(30)]
    mean, _ = guide.predict(fresh)
    truth = np.array([planted_ne(s, a, np.random.default_rng(1)) for a in fresh])
    assert abs(float(np.mean(mean - truth))) < 0.01  # the naive fit would sit ~0.025 above


def test_failed_and_repeated_trials_are_not_observed():
    s = space()
    arch = s.decode(s.sample(np.random.default_rng(0)))
    guide = Guide(s, seed=0)
    assert not guide.observe(arch, TrialResult.failure("nan"))
    assert guide.observe(arch, TrialResult(val_ne=0.8, mflops=1.0))
    assert not guide.observe(arch, TrialResult(val_ne=0.7, mflops=1.0))
    assert len(guide.observations) == 1 and not guide.ready() and guide.width() == 1


SURROGATE = SurrogateConfig(candidates=6, min_trials=3)
OPTIONS = {"random": {}, "evolution": {"population": 4, "sample_size": 2}}


def guided(name: str, seed: int = 0, space: ToySpace | None = None, cfg: SurrogateConfig = SURROGATE):
    return build_strategy(name, space or ToySpace(), seed=seed, surrogate=cfg, **OPTIONS[name])


def run(strategy, n: int, batch: int = 1) -> list[str]:
    hashes = []
    for _ in range(0, n, batch):
        archs = [strategy.ask() for _ in range(batch)]
        hashes += [a.hash for a in archs]
        for a in reversed(archs):
            strategy.tell(a, toy_result(a))
    return hashes


@pytest.mark.parametrize("name", ["random", "evolution"])
def test_guided_strategies_are_deterministic_and_resume_exactly(name):
    first = run(guided(name, seed=3), 14, batch=2)
    assert first == run(guided(name, seed=3), 14, batch=2)
    assert first != run(guided(name, seed=4), 14, batch=2)
    assert len(set(first)) == len(first)
    original = guided(name, seed=1)
    run(original, 9, batch=3)
    assert original.predictions  # the surrogate chose some of them
    pending = [original.ask(), original.ask()]
    state = json.loads(json.dumps(original.state_dict(), allow_nan=False))
    restored = guided(name, seed=1)
    restored.load_state_dict(state)
    assert restored.predictions == original.predictions
    for strategy in (original, restored):
        for a in pending:
            strategy.tell(a, toy_result(a))
    assert run(restored, 9, batch=3) == run(original, 9, batch=3)


@pytest.mark.parametrize("name", ["random", "evolution"])
def test_disabled_surrogate_proposes_as_without_one(name):
    off = guided(name, seed=2, cfg=SurrogateConfig(enabled=False))
    plain = build_strategy(name, ToySpace(), seed=2, **OPTIONS[name])
    assert run(off, 12) == run(plain, 12) and off.predictions == {}


def test_evolution_trains_the_best_ranked_of_several_children_of_one_winner():
    space = ToySpace()
    evo = guided("evolution", seed=0, space=space)
    run(evo, 8)
    space.mutated_from.clear()
    child = evo.ask()
    assert len(space.mutated_from) == SURROGATE.candidates and len(set(space.mutated_from)) == 1  # one winner
    assert child.hash in evo.predictions


def test_guided_evolution_finds_a_better_toy_model_than_unguided_on_average():
    """On the toy trainer (wider is better) with the same number of trainings, the best objective
    found, averaged over seeds, is lower with the surrogate."""
    def best(strategy) -> float:
        run(strategy, 14)
        return min(r.value for r in strategy.history.finished())

    seeds = range(8)
    with_s = [best(guided("evolution", seed=s, cfg=SurrogateConfig(candidates=8, min_trials=4))) for s in seeds]
    without = [best(build_strategy("evolution", ToySpace(), seed=s, **OPTIONS["evolution"])) for s in seeds]
    assert np.mean(with_s) < np.mean(without)


def test_dnas_climb_trains_the_change_the_surrogate_ranks_best(tmp_path, monkeypatch):
    """Of all the origin's untried changes, the climb trains the one holding the option the surrogate
    learnt is better: the one the architecture weights prefer least, not the first (and not one of
    the first ``candidates``, which bounds samples and mutations only)."""
    import torch

    from rankitect.search.base import SearchContext
    from rankitect.search.strategies.dnas import DnasSearch
    from rankitect.supernet.dnas_weights import ArchitectureWeights
    from tests.search.test_dnas import TRAIN, _NoTracker, three_slots
    from tests.search.tiny_data import tiny_click_data

    s, k = three_slots(), 4
    weights = ArchitectureWeights(s)
    with torch.no_grad():
        for i, a in enumerate(weights.logits):
            a.copy_(torch.randn(a.shape, generator=torch.Generator().manual_seed(i)))
    monkeypatch.setattr("rankitect.supernet.dnas_phase.dnas_search", lambda *args, **kw: weights)
    data = tiny_click_data(tmp_path / "data", rows=512)
    context = SearchContext(data=data, train_cfg=TRAIN, seed=0, memory_budget=None, flops_range=None,
                            tracker=_NoTracker(), parent_run_id="parent", echo=lambda line: None)
    strategy = DnasSearch(s, seed=0, objective=Objective(), fill=10,
                          surrogate=SurrogateConfig(candidates=k, kappa=0.0, min_trials=4))
    baseline = s.decode(s.sample(np.random.default_rng(1)))
    strategy.observe(baseline, TrialResult(val_ne=0.8, mflops=1.0))
    strategy.start(context)
    argmax = strategy.ask()
    strategy.tell(argmax, TrialResult(val_ne=0.9, mflops=1.0))  # worse: the baseline is the origin
    changes: list = []
    for move in weights.neighbours(s.encode(baseline)):  # every untried one, in the weights' order
        arch = s.decode(move)
        if arch.hash not in {baseline.hash, argmax.hash} and arch not in changes:
            changes.append(arch)
    assert len(changes) > 2 * k
    base = s.encode(baseline)

    def holds(c, label, option) -> bool:
        return label in s.active(s.encode(c)) and s.encode(c)[label] == option

    for target in reversed(changes):  # the least preferred change whose new option no other change holds
        last = s.encode(target)
        label = next(lb for lb in s.active(last) if last[lb] != base.get(lb))
        if sum(holds(c, label, last[label]) for c in changes) == 1:
            break
    assert changes.index(target) >= k
    rng = np.random.default_rng(0)
    for _ in range(40):  # trained elsewhere: that option is 0.05 better
        arch = s.decode(s.sample(rng))
        sample = s.encode(arch)
        better = label in s.active(sample) and sample[label] == last[label]
        strategy.guide.observe(arch, TrialResult(val_ne=0.8 - 0.05 * better + rng.normal(0, 0.002), mflops=1.0))
    chosen = strategy.ask()
    assert chosen == target and chosen.hash in strategy.predictions


@pytest.mark.slow
def test_a_search_logs_what_the_surrogate_predicted_beside_what_was_measured(env):
    from mlflow import MlflowClient

    from rankitect.config import load_config
    from rankitect.search.running.checkpoint import load_state
    from rankitect.search.running.runner import SearchRunner
    from tests.search.test_runner import TINY, _children

    # Random recipes (learning rates, dropout, norms) leave many few-step trainings no better than
    # the base rate (failed): enough trials and steps that two finish before the last are proposed.
    cfg = load_config(overrides=[*TINY, "search.strategy=random", "search.trials=6", "search.baselines=[]",
                                 "train.steps=16", "train.grace_steps=0", "search.surrogate.min_trials=2",
                                 "search.surrogate.candidates=4"])
    lines: list[str] = []
    outcome = SearchRunner(cfg, echo=lines.append).run()
    trials = load_state(outcome.out_dir / "state.json").candidates()
    observed = 0  # trials finished with a validation NE before each one was proposed
    expected = set()
    for t in trials:
        if observed >= 2:
            expected.add(t.name)
        observed += t.result.ok
    runs = [MlflowClient().get_run(r.info.run_id) for r in _children(outcome.parent_run_id)]
    predicted = {r.data.tags["genotype_hash"]: r.data.metrics for r in runs if "surrogate/predicted_ne" in r.data.metrics}
    assert expected and set(predicted) == expected  # the first were drawn before the surrogate could rank
    for metrics in predicted.values():
        assert metrics["surrogate/spread"] >= 0
    guided = [ln for ln in lines if "surrogate predicted val/ne" in ln]
    assert len(guided) == len(expected) and all(any(h in ln for ln in guided) for h in expected)
