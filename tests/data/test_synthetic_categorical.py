"""The all-categorical generator: no dense features, Zipf ids, profiles, Bayes NE, and a model learns it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rankitect.data import open_data
from rankitect.data.synthetic_categorical import (
    ATTRIBUTE_PAIRS, CROSSES, FIELDS, ITEM_ZIPF, USER_ZIPF, CategoricalTeacher, generate_categorical,
)

SPLITS = ("train", "val", "test")
NAMES = [name for name, _, _ in FIELDS]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return generate_categorical(tmp_path_factory.mktemp("cat") / "d", rows=40_000, seed=3)


def _all(data, key: str) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(data.split(s), key)) for s in SPLITS])


def _col(data, name: str) -> np.ndarray:
    return _all(data, "sparse")[:, NAMES.index(name)]


def test_every_feature_is_categorical_and_sides_hold(data) -> None:
    spec = data.spec
    assert spec.n_dense == 0 and _all(data, "dense").shape == (40_000, 0)
    assert [f.side for f in spec.sparse] == ["request"] * 6 + ["candidate"] * 4
    for s in SPLITS:
        sp = data.split(s)
        starts = sp.request_starts()
        first_row = np.repeat(starts[:-1], np.diff(starts))
        np.testing.assert_array_equal(sp.sparse[:, :6], sp.sparse[first_row, :6])  # one user per request


@pytest.mark.parametrize(("attribute", "owner"), [("user_age", "user_id"), ("user_region", "user_id"),
                                                  ("item_brand", "item_id"), ("item_category", "item_brand")])
def test_attributes_are_functions_of_their_id(data, attribute, owner) -> None:
    pairs = set(zip(_col(data, owner).tolist(), _col(data, attribute).tolist()))
    assert len({o for o, _ in pairs}) == len(pairs)  # each owner id has exactly one value


def _loglog_slope(counts: np.ndarray, top: int) -> tuple[float, float]:
    """Least-squares slope of log(count) on log(rank) over the ``top`` most frequent ids, and R^2."""
    y = np.log(np.sort(counts)[::-1][:top])
    x = np.log(np.arange(1, top + 1))
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    return float(slope), float(1 - resid.var() / y.var())


@pytest.mark.parametrize(("name", "exponent", "top"), [("item_id", ITEM_ZIPF, 30), ("user_id", USER_ZIPF, 12)])
def test_ids_are_zipf(data, name, exponent, top) -> None:
    ids = _col(data, name)
    if name == "user_id":  # one draw per request: count requests, not rows
        starts = np.flatnonzero(np.r_[True, np.diff(_all(data, "request_ids")) != 0])
        ids = ids[starts]
    slope, r2 = _loglog_slope(np.bincount(ids), top)
    assert slope == pytest.approx(-exponent, abs=0.2)
    assert r2 > 0.95


def _naive_prob(t: CategoricalTeacher, row: np.ndarray) -> float:
    """The teacher's click probability of one row, term by term from its tables."""
    first = sum(t.first[f][row[f]] for f in range(len(FIELDS)))
    u, i = row[NAMES.index("user_id")], row[NAMES.index("item_id")]
    factors = sum(t.user_factors[u, k] * t.item_factors[i, k] for k in range(t.user_factors.shape[1]))
    pairs = 0.0
    for (a, b), (p, q) in zip(ATTRIBUTE_PAIRS, t.pair_factors):
        pairs += sum(p[row[a], k] * q[row[b], k] for k in range(p.shape[1]))
    crosses = sum(table[tuple(row[f] for f in fields)] for fields, table in zip(CROSSES, t.crosses))
    logit = t.bias + sum(s * v for s, v in zip(t.term_scale, (first, factors, pairs, crosses)))
    return 1.0 / (1.0 + math.exp(-logit))


def test_bayes_ne_is_the_teachers_logloss(tmp_path) -> None:
    data = generate_categorical(tmp_path / "d", rows=6000, seed=5)
    teacher = CategoricalTeacher(5)
    for s in ("val", "test"):
        sp = data.split(s)
        probs = [_naive_prob(teacher, row) for row in np.asarray(sp.sparse)]
        labels = np.asarray(sp.labels).tolist()
        loss = -sum(y * math.log(p) + (1 - y) * math.log(1 - p) for y, p in zip(labels, probs)) / len(labels)
        ctr = sum(labels) / len(labels)
        entropy = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
        assert sp.bayes_ne == pytest.approx(loss / entropy, rel=1e-4)
        np.testing.assert_allclose(np.asarray(sp.probs), probs, rtol=1e-5, atol=1e-7)


def test_base_rate_and_labels_follow_probs(data) -> None:
    labels, probs = _all(data, "labels"), _all(data, "probs").astype(np.float64)
    assert abs(labels.mean() - 0.15) < 0.02
    hi, lo = probs > 0.4, probs < 0.05
    assert labels[hi].mean() == pytest.approx(probs[hi].mean(), abs=0.05)
    assert labels[lo].mean() == pytest.approx(probs[lo].mean(), abs=0.02)


def test_deterministic_extends_and_independent_of_chunking(tmp_path) -> None:
    a = generate_categorical(tmp_path / "a", rows=3000, seed=7, chunk_rows=50_000)
    b = generate_categorical(tmp_path / "b", rows=3000, seed=7, chunk_rows=700)
    c = generate_categorical(tmp_path / "c", rows=3000, seed=8)
    longer = generate_categorical(tmp_path / "l", rows=6000, seed=7)
    for key in ("sparse", "labels", "probs", "request_ids"):
        np.testing.assert_array_equal(_all(a, key), _all(b, key))
    assert not np.array_equal(_all(a, "sparse"), _all(c, "sparse"))
    k = len(a.split("train")) - 20  # the last request of the short set may be cut short
    np.testing.assert_array_equal(a.split("train").sparse[:k], longer.split("train").sparse[:k])


def test_opened_by_name_and_cached(tmp_path) -> None:
    first = open_data("synthetic-categorical", rows=2000, seed=1, cache_dir=tmp_path)
    stamp = (first.path / "meta.json").stat().st_mtime_ns
    again = open_data("synthetic-categorical", rows=2000, seed=1, cache_dir=tmp_path)
    assert again.path == first.path and (again.path / "meta.json").stat().st_mtime_ns == stamp
    assert first.source == "synthetic-categorical" and first.meta["params"]["rows"] == 2000
    other = open_data("synthetic-categorical", rows=2000, seed=2, cache_dir=tmp_path)
    assert other.path != first.path
    rare = open_data("synthetic-categorical", rows=2000, seed=1, ctr=0.01, cache_dir=tmp_path)
    assert rare.path != first.path and rare.meta["params"]["ctr"] == 0.01
    np.testing.assert_array_equal(_all(rare, "sparse"), _all(first, "sparse"))  # the same rows, fewer clicks
    assert _all(rare, "probs").astype(np.float64).mean() < 0.02 < _all(first, "probs").astype(np.float64).mean()


def test_a_baseline_learns_it_but_not_past_the_floor(tmp_path) -> None:
    from rankitect.config import TrainConfig
    from rankitect.space.baselines import BASELINES
    from rankitect.train.loop import train_architecture

    data = generate_categorical(tmp_path / "d", rows=30_000, seed=0)
    cfg = TrainConfig(max_epochs=2, batch_size=256, progress=False)
    out = train_architecture(BASELINES["deepfm"](data.spec, 8), data, cfg)
    assert data.split("test").bayes_ne < out.metrics["test/ne"] < 1.0
