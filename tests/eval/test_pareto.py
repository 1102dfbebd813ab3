"""Pareto front against a naive O(n^2) dominance check; the table and the plot."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from rankitect.eval.pareto import DPI, FIGSIZE, pareto_figure, pareto_front, pareto_table, plot_pareto
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult


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
    # objective: bbbb pays 0.1 per doubling, log2(10/2) doublings; cccc (0.75, at the target) wins on it
    assert table.loc[table["winner"], "name"].tolist() == ["cccc"]
    assert table.set_index("name").loc["bbbb", "objective"] == pytest.approx(0.70 * (1 + 0.1 * math.log2(5)))
    assert math.isnan(table.set_index("name").loc["dddd", "objective"])


def test_baselines_compete_for_the_winner_and_objective_defaults_to_validation_ne():
    df = pareto_table([("aaaa", ok(0.80, 0.81, 1.0))], [("dlrm", ok(0.5, 0.5, 1.0))])
    assert df.loc[df["winner"], "name"].tolist() == ["dlrm"]
    assert df.set_index("name")["objective"].to_dict() == {"dlrm": 0.5, "aaaa": 0.8}
    failed = pareto_table([("aaaa", ok(0.80, 0.81, 1.0))], [("dlrm", TrialResult.failure("diverged"))])
    assert failed.loc[failed["winner"], "name"].tolist() == ["aaaa"]


def test_plot_writes_a_png(table, tmp_path):
    path = plot_pareto(table, tmp_path / "sub" / "pareto.png", title="toy search")
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


# --- the plot, on a table like a real search's ------------------------------------------------------

BASELINES = ["dlrm", "dcnv2", "deepfm", "autoint", "wukong", "dhen"]


def realistic_table(seed):
    """16 candidates over 2.5 decades of MFLOPs, 3 failed (one before its cost was known), and the
    six baselines clustered where hand-built models sit: NE falls slowly with cost, plus noise."""
    rng = np.random.default_rng(seed)
    results = []
    for _ in range(16):
        mflops = float(np.exp(rng.uniform(np.log(0.08), np.log(25))))
        ne = 0.86 - 0.025 * np.log10(mflops) + rng.normal(0, 0.01)
        results.append((f"{rng.integers(2**62):016x}", ok(ne + 0.002, ne, mflops)))
    results += [(f"fail{i:012d}", TrialResult.failure("diverged", mflops=float(rng.uniform(1, 10)))) for i in range(2)]
    results.append(("fail000000000002", TrialResult.failure("out of memory")))
    costs = [0.6, 1.9, 0.55, 0.7, 4.8, 3.9]
    baselines = [(n, ok(0.85 - 0.004 * i, 0.85 - 0.004 * i + rng.normal(0, 0.002), c))
                 for i, (n, c) in enumerate(zip(BASELINES, costs))]
    return pareto_table(results, baselines, objective=Objective(target_mflops=2.0, penalty="relaxed", weight=0.1))


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def by_label(items):
    return {item.get_label(): item for item in items}


def test_plot_is_a_png_of_the_expected_size(tmp_path):
    path = plot_pareto(realistic_table(0), tmp_path / "sub" / "pareto.png", title="random search on synthetic",
                       floor=0.80)
    assert png_size(path) == (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI)) == (1080, 648)
    image = matplotlib.image.imread(path)
    assert image[..., :3].std() > 0.05  # not a blank canvas


@pytest.mark.parametrize("seed", range(3))
def test_figure_draws_every_point_the_naive_front_the_floor_and_the_failures(seed):
    df = realistic_table(seed)
    fig = pareto_figure(df, title="random search on synthetic", floor=0.80)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and fig.get_suptitle() == "random search on synthetic"
    assert "19 candidates (3 failed), 6 baselines" in " ".join(t.get_text() for t in fig.texts)
    points = by_label(ax.collections)
    fine = df[np.isfinite(df["test_ne"])]
    for label, rows in (("candidates", fine[fine["kind"] == "candidate"]), ("winner", fine[fine["winner"]]),
                        ("hand-designed baselines", fine[fine["kind"] == "baseline"])):
        assert sorted(map(tuple, points[label].get_offsets().tolist())) == sorted(zip(rows["mflops"], rows["test_ne"]))
    assert len(points["failed (no test NE)"].get_offsets()) == 2  # the third failed before its cost was known
    xs, ys = df["mflops"].tolist(), df["test_ne"].tolist()
    front = sorted((x, y) for x, y, on in zip(xs, ys, naive_front(xs, ys)) if on)
    lines = by_label(ax.lines)
    assert list(zip(*lines["Pareto front"].get_data())) == front
    floor = next(line for label, line in lines.items() if label.startswith("Bayes-optimal"))
    assert list(floor.get_ydata()) == [0.80, 0.80] and floor.get_linestyle() == "--"
    assert ax.get_ylim()[0] < 0.80 < ax.get_ylim()[1]


def text_box(text, renderer):
    patch = text.get_bbox_patch()
    return patch.get_window_extent(renderer) if patch is not None else Text.get_window_extent(text, renderer)


@pytest.mark.parametrize("seed", range(3))
def test_labels_name_the_baselines_and_the_winner_and_cover_nothing(seed):
    df = realistic_table(seed)
    fig = pareto_figure(df, floor=0.80)
    fig.canvas.draw()
    renderer, ax = fig.canvas.get_renderer(), fig.axes[0]
    texts = {t.get_text(): t for t in ax.texts}
    win = df[df["winner"]].iloc[0]
    best = df[df["kind"] == "baseline"].sort_values("test_ne").iloc[0]
    change = 100 * (win["test_ne"] / best["test_ne"] - 1)
    winner = (f"winner {win['name']}\ntest NE {win['test_ne']:.4f}, {win['mflops']:.3g} MFLOPs\n"
              f"{change:+.2f}% vs best baseline {best['name']}")
    assert set(texts) == {winner, *BASELINES}
    boxes = {name: text_box(t, renderer) for name, t in texts.items()}
    frame = ax.bbox
    fine = df[np.isfinite(df["test_ne"])]
    points = ax.transData.transform(fine[["mflops", "test_ne"]].to_numpy(dtype=float))
    for name, box in boxes.items():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, name
        assert not [o for o, other in boxes.items() if o != name and box.overlaps(other)], name
        assert not any(box.contains(px, py) for px, py in points), name


def test_plot_of_degenerate_tables(tmp_path):
    every_failed = pareto_table([("aaaa", TrialResult.failure("diverged"))])
    no_baselines = pareto_table([("aaaa", ok(0.8, 0.81, 1.0)), ("bbbb", ok(0.7, 0.72, 3.0))])
    zero_cost = pareto_table([("aaaa", ok(0.8, 0.81, 0.0)), ("bbbb", ok(0.7, 0.72, 3.0))], {"dlrm": ok(0.8, 0.8, 1.0)})
    for i, df in enumerate((every_failed, no_baselines, zero_cost)):
        assert png_size(plot_pareto(df, tmp_path / f"{i}.png", floor=0.5 if i else None)) == (1080, 648)
    assert pareto_figure(zero_cost).axes[0].get_xscale() == "linear"
    assert pareto_figure(no_baselines).axes[0].texts[0].get_text().count("\n") == 1  # no baseline to compare to


def test_table_front_matches_the_naive_check_on_a_realistic_search():
    df = realistic_table(5)
    assert df["on_front"].tolist() == naive_front(df["mflops"].tolist(), df["test_ne"].tolist())
    assert df["on_front"].sum() >= 3 and not df.loc[df["status"] != "ok", "on_front"].any()


def test_pruned_candidates_are_called_pruned_apart_from_failed_ones():
    """A pruned trial was stopped early by the search, not broken: the plot's subtitle and legend say
    so apart from the failed ones (counted from the table's own status column)."""
    df = realistic_table(0)
    pruned = [(f"prun{i:012d}", TrialResult.pruning("hopeless", val_ne=0.9, mflops=float(1 + i), params=10,
                                                    train_seconds=1.0, steps=5)) for i in range(4)]
    ok_rows = [(r["name"], ok(r["val_ne"], r["test_ne"], r["mflops"])) for _, r in df.iterrows()
               if r["status"] == "ok" and r["kind"] == "candidate"]
    table = pareto_table(ok_rows + pruned + [("fail0", TrialResult.failure("diverged", mflops=2.0))],
                         [("dlrm", ok(0.85, 0.85, 0.6))])
    n_cand = int((table["kind"] == "candidate").sum())
    fig = pareto_figure(table)
    assert f"{n_cand} candidates (4 pruned, 1 failed), 1 baseline" in " ".join(t.get_text() for t in fig.texts)
    points = by_label(fig.axes[0].collections)
    assert sorted(points["pruned (no test NE)"].get_offsets()[:, 0].tolist()) == [1.0, 2.0, 3.0, 4.0]
    assert points["failed (no test NE)"].get_offsets()[:, 0].tolist() == [2.0]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "pruned (no test NE)" in legend and "failed (no test NE)" in legend
