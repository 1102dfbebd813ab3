"""The objective against its formula (NE times a penalty per doubling of FLOPs), on floats and tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult


@pytest.mark.parametrize("penalty", ["absolute", "relaxed"])
def test_value_matches_the_formula(penalty):
    rng = np.random.default_rng(0)
    for ne, f, f0, w in rng.uniform([0.3, 0.1, 0.1, 0.0], [1.0, 50.0, 50.0, 1.0], size=(50, 4)):
        doublings = math.log(f / f0) / math.log(2)
        expected = ne * (1 + w * (abs(doublings) if penalty == "absolute" else max(0.0, doublings)))
        assert Objective(target_mflops=f0, penalty=penalty, weight=w).value(ne, f) == pytest.approx(expected)


def test_no_target_is_ne_and_failed_trials_are_worst():
    assert Objective(weight=5.0).value(0.42, 1e6) == 0.42
    objective = Objective(target_mflops=1.0)
    assert objective(TrialResult.failure("diverged")) == math.inf
    assert objective(TrialResult(val_ne=0.5, test_ne=0.1, mflops=1.0)) == 0.5  # ranks by validation NE


@pytest.mark.parametrize("penalty", ["absolute", "relaxed"])
def test_torch_value_equals_value_and_has_the_analytic_gradient(penalty):
    objective = Objective(target_mflops=4.0, penalty=penalty, weight=0.3)
    flops = torch.tensor([1.0, 3.0, 5.0, 9.0], dtype=torch.float64, requires_grad=True)
    ne = torch.full((4,), 0.6, dtype=torch.float64, requires_grad=True)
    out = objective.torch_value(ne, flops)
    expected = [objective.value(0.6, f) for f in flops.tolist()]
    assert out.tolist() == pytest.approx(expected)
    out.sum().backward()
    # d/dF of w |F/F0 - 1| is w sign(F/F0 - 1) / F0; the relaxed form is 0 below the target
    # d/dF of q (1 + w |log2(F/F0)|) is q w sign(F - F0) / (F ln 2); the relaxed form is 0 below F0;
    # d/dq is the penalty factor itself
    f = flops.detach().numpy()
    sign = np.sign(f - 4.0)
    slope = 0.6 * 0.3 * (sign if penalty == "absolute" else (sign > 0)) / (f * math.log(2))
    assert flops.grad.tolist() == pytest.approx(slope.tolist())
    factor = [objective.value(1.0, v) for v in f.tolist()]
    assert ne.grad.tolist() == pytest.approx(factor)


def test_torch_value_without_target_keeps_the_shape():
    out = Objective().torch_value(torch.tensor(0.5), torch.tensor([1.0, 2.0]))
    assert out.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("kwargs, match", [
    ({"penalty": "quadratic"}, "penalty"),
    ({"target_mflops": 0.0}, "target_mflops"),
    ({"weight": -1.0}, "weight"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Objective(**kwargs)


def test_round_trip():
    o = Objective(target_mflops=3.0, penalty="absolute", weight=0.2)
    assert Objective.from_dict(o.to_dict()) == o


def test_default_weight_asks_a_doubling_to_be_clearly_better():
    """At the default weight a 2x model ties only with an NE 1% lower (3 tenths of a percent loses)."""
    objective = Objective(target_mflops=1.0)
    assert objective.value(0.80 / 1.01, 2.0) == pytest.approx(objective.value(0.80, 1.0))
    assert objective.value(0.80 * 0.997, 2.0) > objective.value(0.80, 1.0)
    assert objective.value(0.80 * 0.98, 2.0) < objective.value(0.80, 1.0)
    assert objective.value(0.80, 0.25) == 0.80  # relaxed: cheaper models pay nothing
