"""The synthetic generator: determinism, request structure, sides, base rate and Bayes NE."""

from __future__ import annotations

import numpy as np
import pytest

from rankitect.data import synthetic
from rankitect.data.synthetic import default_data_dir, ensure_default_data, generate_synthetic

SPLITS = ("train", "val", "test")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return generate_synthetic(tmp_path_factory.mktemp("syn") / "d", rows=20_000, seed=0)


def _all(data, key: str) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(data.split(s), key)) for s in SPLITS])


def test_spec_sides_and_vocabularies(data) -> None:
    spec = data.spec
    assert (spec.n_dense, spec.n_sparse) == (13, 26)
    assert [f.side for f in spec.dense] == ["request"] * 4 + ["candidate"] * 9
    assert [f.side for f in spec.sparse] == ["request"] * 8 + ["candidate"] * 18
    sizes = sorted(f.vocab_size for f in spec.sparse)
    assert sizes[0] == 10 and sizes[-1] == 100_000
    ids = _all(data, "sparse")
    assert ids.min() >= 0 and (ids < np.array([f.vocab_size for f in spec.sparse])).all()


def test_requests_share_request_side_and_never_straddle_splits(data) -> None:
    seen: dict[str, set] = {}
    for s in SPLITS:
        sp = data.split(s)
        starts = sp.request_starts()
        first_row = np.repeat(starts[:-1], np.diff(starts))  # each row's request's first row
        np.testing.assert_array_equal(sp.dense[:, :4], sp.dense[first_row, :4])
        np.testing.assert_array_equal(sp.sparse[:, :8], sp.sparse[first_row, :8])
        assert not np.array_equal(sp.sparse[:, 8:], sp.sparse[first_row, 8:])
        seen[s] = set(np.asarray(sp.request_ids).tolist())
        assert len(seen[s]) == sp.n_requests == len(starts) - 1  # contiguous
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"]) and not (seen["val"] & seen["test"])
    sizes = np.bincount(_all(data, "request_ids"))
    assert sizes.sum() == 20_000 and sizes.max() <= 20 and 7 < sizes.mean() < 9
    assert 0.75 < len(data.split("train")) / 20_000 < 0.85


def test_base_rate_and_bayes_ne(data) -> None:
    labels, probs = _all(data, "labels"), _all(data, "probs").astype(np.float64)
    assert abs(labels.mean() - 0.25) < 0.02
    assert abs(probs.mean() - 0.25) < 0.02
    for s in SPLITS:
        assert 0.75 < data.split(s).bayes_ne < 0.9
    # labels really are Bernoulli(probs): rows with high p click more than rows with low p
    hi, lo = probs > 0.5, probs < 0.1
    assert labels[hi].mean() == pytest.approx(probs[hi].mean(), abs=0.05)
    assert labels[lo].mean() == pytest.approx(probs[lo].mean(), abs=0.03)


def test_ids_are_zipf_like(data) -> None:
    big = int(np.argmax([f.vocab_size for f in data.spec.sparse]))
    ids = _all(data, "sparse")[:, big]
    counts = np.sort(np.bincount(ids[ids > 0]))[::-1]
    assert counts[0] > 50 * np.median(counts[counts > 0])  # a heavy head and a long tail


def test_deterministic_and_independent_of_chunking(tmp_path) -> None:
    a = generate_synthetic(tmp_path / "a", rows=3000, seed=7, chunk_rows=50_000)
    b = generate_synthetic(tmp_path / "b", rows=3000, seed=7, chunk_rows=700)
    c = generate_synthetic(tmp_path / "c", rows=3000, seed=8)
    longer = generate_synthetic(tmp_path / "l", rows=6000, seed=7)
    for key in ("dense", "sparse", "labels", "probs", "request_ids"):
        np.testing.assert_array_equal(_all(a, key), _all(b, key))
    assert not np.array_equal(_all(a, "labels"), _all(c, "labels"))
    # more rows extend fewer rows: the first requests are identical
    tr, tl = a.split("train"), longer.split("train")
    k = len(tr) - 20  # the last request of the short set may be cut short
    np.testing.assert_array_equal(tr.sparse[:k], tl.sparse[:k])
    np.testing.assert_array_equal(tr.probs[:k], tl.probs[:k])


def test_default_data_is_generated_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    first = ensure_default_data(rows=1500)
    assert first.path == default_data_dir(rows=1500) and first.path.parent == tmp_path / "cache"

    def boom(*args, **kwargs):
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(synthetic, "generate_synthetic", boom)
    again = ensure_default_data(rows=1500)
    assert again.path == first.path and again.meta == first.meta
    with pytest.raises(AssertionError, match="regenerated"):
        ensure_default_data(rows=1600)  # other parameters: another cache entry


def test_a_rare_click_rate_shifts_the_same_teacher(tmp_path) -> None:
    # The same rows and teacher, only the bias moved: a rare-click ad log (under 1% clicks).
    rare = generate_synthetic(tmp_path / "rare", rows=20_000, seed=0, ctr=0.0064)
    common = generate_synthetic(tmp_path / "common", rows=20_000, seed=0)
    labels, probs = _all(rare, "labels"), _all(rare, "probs").astype(np.float64)
    assert abs(probs.mean() - 0.0064) < 0.002
    assert abs(labels.mean() - 0.0064) < 4 * np.sqrt(0.0064 / 20_000)  # a binomial's spread
    np.testing.assert_array_equal(_all(rare, "sparse"), _all(common, "sparse"))
    # logit(p_rare) - logit(p_common) is one constant: the teacher's bias, solved for the rate
    logit = lambda p: np.log(p) - np.log1p(-p)  # noqa: E731
    shift = logit(probs) - logit(_all(common, "probs").astype(np.float64))
    assert np.ptp(shift[np.isfinite(shift)]) < 1e-3 and shift.mean() < -3
    assert rare.meta["params"]["ctr"] == 0.0064 and "ctr" not in common.meta["params"]
    assert default_data_dir(rows=100, ctr=0.0064) != default_data_dir(rows=100)
    with pytest.raises(ValueError, match="ctr must be a click rate strictly between 0 and 1, got 1.5"):
        generate_synthetic(tmp_path / "bad", rows=100, ctr=1.5)
