"""The winner and the ``auto`` target under validation noise: paired standard errors against the
textbook formula and against the spread of resampled validation sets, the rule on built cases, the
per-example losses the protocol keeps against a naive loop over the model's logits, and a search
that keeps its baseline."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from rankitect.config import TrainConfig, load_config
from rankitect.eval.metrics import entropy
from rankitect.eval.result import TrialResult
from rankitect.eval.objective import Objective
from rankitect.search.running.runner import SearchRunner
from rankitect.search.judging.selection import Entrant, auto_target, choose_winner, paired_gain
from rankitect.search.judging.standings import ExampleLosses
from rankitect.space.baselines import get_baseline
from rankitect.train.loop import train_architecture
from tests.learnable import learnable_source

from .tiny_data import tiny_click_data


def test_paired_gain_is_the_textbook_paired_difference():
    rng = np.random.default_rng(1)
    inc, ch = rng.exponential(0.5, 500), rng.exponential(0.45, 500)
    h, ki, kc = 0.6, 1.0, 1.02
    d = [(ki * a - kc * b) / h for a, b in zip(inc, ch)]  # a plain loop
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    gain, se = paired_gain(inc, ch, entropy=h, k_incumbent=ki, k_challenger=kc)
    assert gain == pytest.approx(mean, rel=1e-12) and se == pytest.approx(sd / math.sqrt(len(d)), rel=1e-12)


def test_paired_standard_error_matches_the_spread_over_resampled_validation_sets():
    """Two models scored on many independent validation sets drawn from one population: the
    standard deviation of their NE difference across the sets is what one set's paired error
    estimates."""
    rng = np.random.default_rng(2)
    n, sets = 2_000, 400
    logit = rng.normal(-1.0, 1.5, size=(sets, n))  # the true log-odds of each row
    y = (rng.random((sets, n)) < 1 / (1 + np.exp(-logit))).astype(float)

    def losses(z):
        return np.logaddexp(0, z) - y * z

    a = losses(logit + rng.normal(0, 0.3, size=(sets, n)))  # two imperfect models
    b = losses(0.8 * logit + rng.normal(0, 0.3, size=(sets, n)))
    h = np.array([entropy(r.mean()) for r in y])
    diffs = (b.mean(axis=1) - a.mean(axis=1)) / h
    estimates = [paired_gain(b[i], a[i], entropy=h[i])[1] for i in range(sets)]
    assert np.mean(estimates) == pytest.approx(diffs.std(ddof=1), rel=0.1)
    unpaired = np.sqrt(a.var(axis=1, ddof=1) / n + b.var(axis=1, ddof=1) / n) / h
    assert np.mean(estimates) < 0.5 * unpaired.mean()  # what pairing buys


def test_paired_gain_refuses_unpaired_input():
    with pytest.raises(ValueError, match="same length"):
        paired_gain(np.zeros(3), np.zeros(4), entropy=0.5)
    with pytest.raises(ValueError, match="entropy"):
        paired_gain(np.zeros(3), np.zeros(3), entropy=0.0)


def _entrant(name: str, kind: str, losses: np.ndarray, mflops: float = 1.0, h: float = 0.5) -> Entrant:
    return Entrant(name, kind, TrialResult(val_ne=float(losses.mean()) / h, mflops=mflops), losses)


def _pair(gain_in_se: float, n: int = 4_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Incumbent and challenger losses whose observed gain is exactly ``gain_in_se`` paired errors (H = 0.5)."""
    rng = np.random.default_rng(seed)
    base = rng.exponential(0.5, n)
    noise = rng.normal(0, 0.2, n)
    noise -= noise.mean()
    se = noise.std(ddof=1) / math.sqrt(n) / 0.5
    return base, base - noise - gain_in_se * se * 0.5


@pytest.mark.parametrize("z, wins", [(0.5, False), (1.5, True), (3.0, True)])
def test_a_candidate_beats_the_incumbent_only_by_more_than_min_gain_se(z, wins):
    inc, ch = _pair(z)
    entrants = [_entrant("dlrm", "baseline", inc), _entrant("c1", "candidate", ch),
                _entrant("dcnv2", "baseline", inc + 0.05)]
    choice = choose_winner(entrants, Objective(), min_gain_se=1.0)
    assert choice.incumbent.name == "dlrm"
    assert choice.winner.name == ("c1" if wins else "dlrm")
    if wins:
        assert choice.z == pytest.approx(z, rel=1e-6)
        assert "better on validation than the best baseline, dlrm by" in choice.line(1.0)
    else:
        assert choice.runner_up[0].name == "c1" and choice.runner_up[1] == pytest.approx(z, rel=1e-6)
        assert "c1, is better on validation by 0.50 standard errors only" in choice.line(1.0)


def test_the_best_candidate_that_passes_wins_and_flops_factors_enter_the_error():
    rng = np.random.default_rng(3)
    inc = rng.exponential(0.5, 4_000)
    big, small = rng.normal(0, 2.0, 4_000), rng.normal(0, 0.01, 4_000)
    near = inc - 0.02 + (big - big.mean())  # the larger gain (0.04 NE), but within its noise
    far = inc - 0.01 + (small - small.mean())  # half the gain, far above its noise
    entrants = [_entrant("b", "baseline", inc), _entrant("near", "candidate", near), _entrant("far", "candidate", far)]
    objective = Objective()
    assert objective(entrants[1].result) < objective(entrants[2].result) < objective(entrants[0].result)
    choice = choose_winner(entrants, objective, 1.0)
    assert choice.winner.name == "far" and choice.z > 10
    # above the target a candidate's losses are weighed by k = 1 + w * doublings: four doublings at w=0.01
    target = Objective(target_mflops=1.0, weight=0.01)
    costly = [_entrant("b", "baseline", inc), _entrant("far", "candidate", far / 1.04 - 0.001, mflops=16.0)]
    choice = choose_winner(costly, target, 1.0)
    gain = target(costly[0].result) - target(costly[1].result)
    _, se = paired_gain(inc, costly[1].losses, entropy=0.5, k_challenger=1.04)
    _, se_plain = paired_gain(inc, costly[1].losses, entropy=0.5)
    assert choice.winner.name == "far" and choice.z == pytest.approx(gain / se, rel=1e-6)
    assert abs(se - se_plain) > 0.01 * se


@pytest.mark.parametrize("apart", [0.3, 3.0])
def test_of_the_candidates_that_pass_the_cheapest_within_the_noise_of_the_best_wins(apart):
    """Two candidates both far better than the baseline; the costlier one is the better by ``apart``
    paired standard errors of their own difference. Within one error the cheaper wins (the
    one-standard-error rule: the simpler of two models the noise cannot tell apart); beyond it the
    better one does."""
    n, h = 4_000, 0.5
    rng = np.random.default_rng(7)
    inc = rng.exponential(0.5, n)
    noise = rng.normal(0, 0.2, n)
    noise -= noise.mean()
    small = inc - 0.02  # 0.04 NE better than the baseline, the same on every row
    se = noise.std(ddof=1) / math.sqrt(n) / h  # of big against small, in NE
    big = small - noise - apart * se * h
    entrants = [_entrant("b", "baseline", inc), _entrant("big", "candidate", big, mflops=4.0),
                _entrant("small", "candidate", small, mflops=1.0)]
    gain, err = paired_gain(small, big, entropy=h)
    assert gain / err == pytest.approx(apart, rel=1e-6)  # the built gap, by the textbook formula
    choice = choose_winner(entrants, Objective(), 1.0)
    if apart < 1:
        assert choice.winner.name == "small" and choice.best.name == "big"
        assert "the cheapest candidate within 1 standard error of the best, big" in choice.line(1.0)
    else:
        assert choice.winner.name == "big" and choice.best is None
    assert choice.z > 5  # against the baseline, either passes by far


def test_zero_min_gain_se_is_the_plain_rule_on_random_cases():
    rng = np.random.default_rng(5)
    objective = Objective(target_mflops=1.0)
    for _ in range(50):
        entrants = [_entrant(f"m{i}", "baseline" if i < 3 else "candidate", rng.exponential(0.5, 50) + rng.random(),
                             mflops=float(rng.choice([0.5, 1.0, 4.0]))) for i in range(8)]
        plain = min(entrants, key=lambda e: objective(e.result))  # first on ties, like pareto_table
        assert choose_winner(entrants, objective, 0.0).winner is plain


def test_without_losses_or_baselines_the_plain_rule_decides():
    inc, ch = _pair(0.5)
    bare = [Entrant(e.name, e.kind, e.result) for e in (_entrant("b", "baseline", inc), _entrant("c", "candidate", ch))]
    assert choose_winner(bare, Objective(), 1.0).winner.name == "c"  # no paired error: any gain counts
    only = [_entrant("c", "candidate", ch), _entrant("d", "candidate", inc)]
    choice = choose_winner(only, Objective(), 1.0)
    assert choice.winner.name == "c" and choice.incumbent is None
    failed = Entrant("x", "baseline", TrialResult.failure("boom"))
    assert choose_winner([failed], Objective()) is None


def _named(target) -> list[str]:
    return [target.target.name, target.best.name, target.cheapest.name]


def test_cheapest_target_is_the_cheapest_baseline_within_the_noise_of_the_best():
    inc, tied = _pair(0.5, seed=6)  # "best" is better than "cheap" by half an error only
    _, far = _pair(5.0, seed=6)
    best = _entrant("best", "baseline", tied, mflops=4.0)
    cheap = _entrant("cheap", "baseline", inc, mflops=0.5)
    assert _named(auto_target([cheap, best], 1.0, rule="cheapest")) == ["cheap", "best", "cheap"]
    assert _named(auto_target([cheap, best], 0.0, rule="cheapest")) == ["best", "best", "best"]
    clear = _entrant("clear", "baseline", far, mflops=4.0)  # better by five errors: cheap is not tied
    assert _named(auto_target([cheap, clear], 1.0, rule="cheapest")) == ["clear", "clear", "clear"]
    # auto aims at the best whatever the noise, and names the cheapest within it
    found = auto_target([cheap, best], 1.0)
    assert _named(found) == ["best", "best", "cheap"]
    assert "the cheapest baseline within 1 standard error of it: cheap at 0.5000 MFLOPs" in found.line(1.0)
    assert _named(auto_target([cheap, clear], 1.0)) == ["clear", "clear", "clear"]


@pytest.mark.parametrize("gain, costly_is_target", [(0.02, False), (0.05, True)])
def test_cheapest_target_weighs_a_baselines_flops_as_the_objective_does(gain, costly_is_target):
    """A baseline eight times the cost of another (three doublings: 3% of NE at weight 0.01) is the
    better one only if its NE is lower by more than that; by NE alone it is better at any gain."""
    base = np.random.default_rng(8).exponential(0.5, 4_000)
    cheap = _entrant("cheap", "baseline", base, mflops=0.5)
    costly = _entrant("costly", "baseline", base * (1 - gain), mflops=4.0)
    objective = Objective(weight=0.01)
    by_hand = min((cheap, costly), key=lambda e: e.result.val_ne * (1 + 0.01 * math.log2(e.result.mflops / 0.5)))
    assert (by_hand is costly) == costly_is_target
    assert _named(auto_target([cheap, costly], 1.0, objective, rule="cheapest"))[:2] == [by_hand.name] * 2
    assert _named(auto_target([cheap, costly], 1.0, rule="cheapest"))[:2] == ["costly", "costly"]  # NE alone
    assert _named(auto_target([cheap, costly], 1.0, Objective(weight=0.0), rule="cheapest"))[:2] == ["costly"] * 2
    assert _named(auto_target([cheap, costly], 1.0, objective))[:2] == ["costly", "costly"]  # auto: NE alone


def test_val_losses_round_trip_and_refuse_paths(tmp_path):
    store = ExampleLosses(tmp_path)
    losses = np.random.default_rng(7).random(10)
    store.save("dlrm", losses)
    assert np.allclose(store.load("dlrm"), losses, atol=1e-7) and store.load("dlrm").dtype == np.float32
    assert store.load("nothing") is None
    (tmp_path / "val_losses" / "bad.npy").write_text("not an array")
    assert store.load("bad") is None
    for name in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="plain file name"):
            store.save(name, losses)


def test_the_protocol_keeps_the_best_validations_losses(tmp_path):
    data = tiny_click_data(tmp_path / "tiny", rows=1024)
    cfg = replace(TrainConfig(batch_size=64, progress=False, max_epochs=2, test_batches=2), seed=3)
    out = train_architecture(get_baseline("deepfm", data.spec), data, cfg)
    model = out.model.eval()
    naive = []
    with torch.no_grad():
        for batch in data.split("val").batches(64, shuffle=False):
            for z, y in zip(model(batch).reshape(-1).tolist(), batch.labels.tolist()):
                naive.append(math.log1p(math.exp(z)) - y * z)  # log(1 + e^z) - y z
    assert len(out.val_losses) == len(data.split("val"))
    assert np.allclose(out.val_losses, naive, atol=1e-5)
    labels = torch.cat([b.labels for b in data.split("val").batches(64, shuffle=False)])
    assert np.mean(naive) / entropy(float(labels.float().mean())) == pytest.approx(out.metrics["val/ne"], rel=1e-5)


def test_a_search_keeps_its_baseline_when_no_candidate_clears_the_noise(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    # the rule on validation alone (no rows held out for a verdict: tests/search/test_verdict.py)
    tiny = ["train.max_epochs=1", "train.batch_size=64", "runtime.threads=1", "search.workers=1", "search.trials=3",
            "search.baselines=[dlrm,deepfm]", "search.evolution.population=2", "search.evolution.sample_size=2",
            "search.verdict.fraction=0"]
    runs = {}
    for z in (0.0, 1e6):  # the plain rule, and a rule no candidate can meet
        lines: list[str] = []
        cfg = load_config(overrides=[f"data.source={learnable_source()}", *tiny, f"search.min_gain_se={z}"])
        runner = SearchRunner(cfg, echo=lines.append)
        outcome = runner.run()
        runs[z] = (outcome, lines, runner)
    plain, strict = runs[0.0][0].table, runs[1e6][0].table
    ok = strict[strict["status"] == "ok"]
    bases = ok[ok["kind"] == "baseline"]
    assert strict.loc[strict["winner"], "name"].item() == bases.loc[bases["objective"].idxmin(), "name"]
    assert plain.loc[plain["winner"], "objective"].item() == plain.loc[plain["status"] == "ok", "objective"].min()
    closing = runs[1e6][0].verdict.lines(1e6)  # what the command prints last
    assert closing[0].startswith(f"winner {strict.loc[strict['winner'], 'name'].item()} (baseline;")
    runner = runs[1e6][2]
    val_rows = len(runner.data.split("val"))
    for name in ok["name"]:  # every ok trial's losses kept, one per validation row
        assert len(runner.standings.val_losses.load(name)) == val_rows
    if (plain.loc[plain["winner"], "kind"] == "candidate").item():  # same seeds: the rule alone changed it
        assert runs[1e6][0].best != runs[0.0][0].best


def test_the_winner_keeps_its_weights_whatever_keep_top_k(tmp_path, monkeypatch):
    """keep_top_k=0: no candidate keeps weights for ranking high, yet the winner (a candidate: no
    baselines) keeps them, so ``export`` of the search run finds its model."""
    from rankitect.space.architecture import Architecture
    from rankitect.track.mlflow_tracker import Tracker

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(overrides=[f"data.source={learnable_source()}", "train.max_epochs=1", "train.batch_size=64",
                                 "runtime.threads=1", "search.workers=1", "search.trials=3", "search.baselines=[]",
                                 "search.strategy=random", "search.keep_top_k=0",
                                 "search.target_mflops=null"])
    outcome = SearchRunner(cfg, echo=lambda line: None).run()
    files = Tracker(uri, "rankitect").fetch_model_files(outcome.parent_run_id, tmp_path / "won")
    assert files.weights.is_file()
    assert Architecture.from_json(files.genotype.read_text()) == outcome.best
    cands = outcome.table[(outcome.table["kind"] == "candidate") & (outcome.table["status"] == "ok")]
    assert (outcome.table.loc[outcome.table["winner"], "kind"] == "candidate").all()
