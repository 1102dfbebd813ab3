"""The default objective returns the best model: its target is the FLOPs of the best baseline by
validation NE, and a candidate better on validation at no more than that cost wins.

Expectations are computed by hand from the formula ``NE * (1 + w * max(0, log2(F / F0)))`` with
the default weight ``w = 0.01`` and ``F0`` the target.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rankitect.config import load_config
from rankitect.eval.result import TrialResult
from rankitect.search.factory import objective_from_config
from rankitect.search.judging.selection import Entrant, auto_target, choose_winner

H = 0.5  # the validation split's entropy, nats
N = 4_000


def _entrant(name: str, kind: str, losses: np.ndarray, mflops: float) -> Entrant:
    return Entrant(name, kind, TrialResult(val_ne=float(losses.mean()) / H, mflops=mflops), losses)


def _losses(ne: float, base: np.ndarray, seed: int) -> np.ndarray:
    """Per-row losses with mean ``ne * H`` that follow ``base`` row by row (small paired noise)."""
    noise = np.random.default_rng(seed).normal(0, 0.01, N)
    x = base + noise - noise.mean()
    return x - x.mean() + ne * H


def test_the_default_target_is_the_best_baselines_flops_and_a_better_candidate_under_it_wins() -> None:
    cfg = load_config()
    assert cfg.search.target_mflops == "auto" and cfg.search.penalty == "relaxed"
    w = cfg.search.penalty_weight
    base = np.random.default_rng(0).exponential(H, N)
    cheap = _entrant("cheap", "baseline", _losses(0.820, base, 1), mflops=0.08)
    better = _entrant("better", "baseline", _losses(0.800, base, 2), mflops=0.90)
    # By hand, under the old rule the costly one pays for its doublings beyond the cheapest:
    # 0.800 * (1 + 0.01 * log2(0.90 / 0.08)) = 0.8279 > 0.820, so it aimed at the cheap one.
    assert 0.800 * (1 + w * math.log2(0.90 / 0.08)) > 0.820
    assert auto_target([cheap, better], cfg.search.min_gain_se, objective_from_config(cfg.search),
                       rule="cheapest").target is cheap
    found = auto_target([cheap, better], cfg.search.min_gain_se, objective_from_config(cfg.search),
                        rule=cfg.search.target_mflops)
    assert found.target is better and found.mflops == 0.90  # the model a team would ship
    objective = objective_from_config(cfg.search).with_target(found.mflops)

    under = _entrant("under", "candidate", _losses(0.790, base, 3), mflops=0.60)  # better, cheaper
    over = _entrant("over", "candidate", _losses(0.795, base, 4), mflops=1.80)  # better, one doubling more
    # By hand: under pays nothing (0.790 < 0.800); over pays one doubling: 0.795 * 1.01 = 0.80295 > 0.800.
    assert objective(under.result) == pytest.approx(0.790)
    assert objective(over.result) == pytest.approx(0.795 * (1 + w))
    assert objective(better.result) == pytest.approx(0.800)  # no penalty at its own FLOPs
    assert objective(cheap.result) == pytest.approx(0.820)  # and no reward for being cheaper
    choice = choose_winner([cheap, better, under, over], objective, cfg.search.min_gain_se)
    assert choice.incumbent is better and choice.winner is under
    alone = choose_winner([cheap, better, over], objective, cfg.search.min_gain_se)
    assert alone.winner is better  # better on NE, but not by enough for twice the cost


def test_a_user_asks_for_a_cheaper_target_by_name() -> None:
    assert objective_from_config(load_config(overrides=["search.target_mflops=0.1"]).search).target_mflops == 0.1
    cfg = load_config(overrides=["search.target_mflops=cheapest"]).search
    assert cfg.target_mflops == "cheapest" and objective_from_config(cfg).target_mflops is None  # until baselines


def test_simplest_aims_at_the_cheapest_baseline_within_the_noise_of_the_best() -> None:
    base = np.random.default_rng(0).exponential(H, N)
    wide = np.random.default_rng(9).normal(0, 0.3, N)  # a model whose rows differ a lot from the best's
    best = _entrant("wukong", "baseline", _losses(0.800, base, 1), mflops=5.0)
    near = _entrant("dhen", "baseline", base - base.mean() + 0.801 * H + wide - wide.mean(), mflops=1.0)
    far = _entrant("dlrm", "baseline", _losses(0.830, base, 2), mflops=0.3)  # cheapest, clearly worse
    d = (near.losses - best.losses) / H  # dhen's paired difference, by hand: under one standard error
    assert d.mean() / (d.std(ddof=1) / math.sqrt(N)) < 1.0
    found = auto_target([best, near, far], 1.0, rule="simplest")
    assert found.best is best and found.target is near and found.mflops == 1.0
    assert auto_target([best, near, far], 1.0).target is best  # auto: the best by val NE, noise and all
    assert "the cheapest baseline within 1 standard error of the best by val/ne, wukong" in found.line(1.0)
