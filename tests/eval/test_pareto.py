"""Pareto front against a naive O(n^2) dominance check; the table and the plot."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from rankitect.eval.pareto import pareto_front, pareto_table, plot_pareto
from rankitect.search import Objective, TrialResult


def naive_front(xs, ys):
    def dominates(i, j):
        return xs[i] <= xs[j] and ys[i] <= ys[j] and (xs[i] < xs[j] or ys[i] < ys[j])

    valid = [math.isfinite(a) and math.isfinite(b) for a, b in zip(xs, ys)]
    return [valid[j] and not any(valid[i] and dominates(i, j) for i in range(len(xs))) for j in range(len(xs))]


@pytest.mark.parametrize("seed", range(6))
def test_front_matches_the_naive_check_with_ties_and_missing_values(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    # a coarse grid makes equal x, equal y and identical points common
    xs, ys = rng.integers(0, 6, n).astype(float), rng.integers(0, 6, n).astype(float)
    xs[rng.random(n) < 0.1] = np.nan
    ys[rng.random(n) < 0.05] = np.inf
    mask = pareto_front(pd.DataFrame({"mflops": xs, "test_ne": ys}))
    assert mask.tolist() == naive_front(xs.tolist(), ys.tolist())


def test_front_on_other_columns_and_empty_frames():
    df = pd.DataFrame({"params": [3, 1, 2], "val_ne": [0.1, 0.3, 0.2]})
    assert pareto_front(df, x="params", y="val_ne").tolist() == [True, True, True]
    assert pareto_front(pd.DataFrame({"mflops": [], "test_ne": []})).tolist() == []


def ok(val_ne, test_ne, mflops):
    return TrialResult(val_ne=val_ne, test_ne=test_ne, test_auc=0.7, test_logloss=0.4, mflops=mflops, params=100)


@pytest.fixture()
def table():
    results = [
        ("aaaa", ok(0.80, 0.81, 1.0)),
        ("bbbb", ok(0.70, 0.72, 10.0)),  # best NE, far over the target
        ("cccc", ok(0.75, 0.76, 2.0)),
        ("dddd", TrialResult.failure("diverged", mflops=3.0)),
        ("eeee", ok(0.79, 0.90, 5.0)),  # dominated
    ]
    baselines = {"dlrm": ok(0.78, 0.78, 1.5), "dcnv2": ok(0.76, 0.74, 20.0)}
    objective = Objective(target_mflops=2.0, penalty="relaxed", weight=0.1)
    return pareto_table(results, baselines, objective=objective)


def test_table_rows_order_front_and_winner(table):
    assert table["test_ne"].tolist()[:6] == sorted(table["test_ne"].dropna().tolist())
    assert table["name"].iloc[-1] == "dddd" and table["status"].iloc[-1] == "failed"
    assert dict(zip(table["name"], table["kind"]))["dlrm"] == "baseline"
    assert table["on_front"].tolist() == pareto_front(table).tolist()
    assert set(table.loc[table["on_front"], "name"]) == {"aaaa", "bbbb", "cccc", "dlrm"}
    # objective: bbbb pays 0.1 * (10/2 - 1) = 0.4; cccc (0.75, at the target) wins on it
    assert table.loc[table["winner"], "name"].tolist() == ["cccc"]
    assert table.set_index("name").loc["bbbb", "objective"] == pytest.approx(0.70 + 0.4)
    assert math.isnan(table.set_index("name").loc["dddd", "objective"])


def test_baseline_never_wins_and_objective_defaults_to_validation_ne():
    df = pareto_table([("aaaa", ok(0.80, 0.81, 1.0))], [("dlrm", ok(0.5, 0.5, 1.0))])
    assert df.loc[df["winner"], "name"].tolist() == ["aaaa"]
    assert df.set_index("name")["objective"].to_dict() == {"dlrm": 0.5, "aaaa": 0.8}


def test_plot_writes_a_png(table, tmp_path):
    path = plot_pareto(table, tmp_path / "sub" / "pareto.png", title="toy search")
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
