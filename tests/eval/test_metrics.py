"""Metrics against textbook formulas written out naively here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankitect.data.synthetic import generate_synthetic
from rankitect.eval.metrics import (
    MetricAccumulator, auc, calibration, logloss, logloss_from_logits, ne, ne_from_logits, ranking_metrics,
)


def naive_logloss(p: list[float], y: list[float]) -> float:
    return -sum(yi * math.log(pi) + (1 - yi) * math.log(1 - pi) for pi, yi in zip(p, y)) / len(p)


def naive_ne(p: list[float], y: list[float]) -> float:
    c = sum(y) / len(y)
    return naive_logloss(p, y) / -(c * math.log(c) + (1 - c) * math.log(1 - c))


def naive_auc(s: list[float], y: list[float]) -> float:
    pos = [a for a, t in zip(s, y) if t == 1]
    neg = [a for a, t in zip(s, y) if t == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


P = [0.9, 0.2, 0.6, 0.35, 0.05, 0.7, 0.5]
Y = [1, 0, 1, 0, 0, 0, 1]


def test_logloss_and_ne_match_the_formulas() -> None:
    assert logloss(P, Y) == pytest.approx(naive_logloss(P, Y), rel=1e-12)
    assert ne(P, Y) == pytest.approx(naive_ne(P, Y), rel=1e-12)
    assert ne(torch.tensor(P), torch.tensor(Y)) == pytest.approx(naive_ne(P, Y), rel=1e-6)


def test_from_logits_agrees_with_probabilities() -> None:
    z = [math.log(p / (1 - p)) for p in P]
    assert logloss_from_logits(z, Y) == pytest.approx(naive_logloss(P, Y), rel=1e-12)
    assert ne_from_logits(np.array(z), np.array(Y)) == pytest.approx(naive_ne(P, Y), rel=1e-12)
    m = ranking_metrics(torch.tensor(z), torch.tensor(Y, dtype=torch.float32))
    assert m["ne"] == pytest.approx(naive_ne(P, Y), rel=1e-6)
    assert m["calibration"] == pytest.approx((sum(P) / len(P)) / (sum(Y) / len(Y)), rel=1e-6)
    assert m["ctr"] == pytest.approx(3 / 7)


def test_base_rate_predictor_has_ne_one() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(1000) < 0.3).astype(float)
    assert ne(np.full(1000, y.mean()), y) == pytest.approx(1.0, abs=1e-12)
    assert calibration(np.full(1000, y.mean()), y) == pytest.approx(1.0)


def test_auc_matches_pairwise_count_with_ties() -> None:
    rng = np.random.default_rng(1)
    s = rng.integers(0, 6, 80).astype(float)  # many ties
    y = (rng.random(80) < 0.4).astype(float)
    assert auc(s, y) == pytest.approx(naive_auc(s.tolist(), y.tolist()), abs=1e-6)  # torchmetrics returns float32


def test_degenerate_inputs() -> None:
    assert math.isnan(auc([0.1, 0.2], [1, 1]))
    assert math.isnan(ne([0.1, 0.2], [0, 0]))
    assert math.isfinite(logloss([0.0, 1.0], [1, 0]))  # clamped, not infinite
    with pytest.raises(ValueError, match="3 values"):
        logloss([0.1, 0.2, 0.3], [1, 0])


def test_accumulator_equals_one_shot() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(size=300)
    y = (rng.random(300) < 0.3).astype(np.float32)
    acc = MetricAccumulator()
    for i in range(0, 300, 64):
        acc.update(torch.tensor(z[i:i + 64]).view(-1, 1), torch.tensor(y[i:i + 64]))
    got, want = acc.compute(), ranking_metrics(z, y)
    assert acc.count == 300
    for k in ("ne", "logloss", "calibration", "ctr"):
        assert got[k] == pytest.approx(want[k], rel=1e-12)
    assert got["auc"] == pytest.approx(want["auc"], abs=1e-6)
    acc.reset()
    with pytest.raises(ValueError):
        acc.compute()


def test_true_probabilities_reach_the_reported_bayes_ne(tmp_path) -> None:
    data = generate_synthetic(tmp_path / "s", rows=3000, seed=3)
    for name in ("train", "val"):
        split = data.split(name)
        p, y = np.asarray(split.probs, np.float64).tolist(), np.asarray(split.labels).tolist()
        assert split.bayes_ne == pytest.approx(naive_ne(p, y), rel=1e-9)
        assert ne(split.probs, split.labels) == pytest.approx(naive_ne(p, y), rel=1e-9)
