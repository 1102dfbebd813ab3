"""The cached format: round trip, statistics, batches and request-preserving shuffles."""

from __future__ import annotations

import numpy as np
import pytest

from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.data.store import ClickData, StoreWriter
from rankitect.errors import DataError

SPEC = FeatureSpec(dense=(DenseFeature("d0"), DenseFeature("d1")),
                   sparse=(SparseFeature("u", 7, side="request"), SparseFeature("s", 50)))


def _rows(n_requests: int, seed: int) -> dict[str, np.ndarray]:
    """Requests of 1..5 rows; ids chosen so each row is recognisable (s = row % 50)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_requests)
    rid = np.repeat(np.arange(100, 100 + n_requests), sizes)
    n = len(rid)
    sparse = np.stack([rid % 7, np.arange(n) % 50], 1)
    return {"dense": rng.normal(size=(n, 2)).astype(np.float32), "sparse": sparse,
            "labels": (rng.random(n) < 0.3).astype(np.float32), "request_ids": rid}


@pytest.fixture()
def data(tmp_path) -> tuple[ClickData, dict[str, np.ndarray]]:
    r = _rows(60, 0)
    n = len(r["labels"])
    with StoreWriter(tmp_path / "d", SPEC, {"train": n, "val": 0, "test": 0}) as w:
        for i in range(0, n, 17):  # several chunks, cutting requests
            w.write("train", *(r[k][i:i + 17] for k in ("dense", "sparse", "labels", "request_ids")))
        w.close({"source": "test"})
    return ClickData.open(tmp_path / "d"), r


def test_round_trip_and_stats(data) -> None:
    d, r = data
    tr = d.split("train")
    np.testing.assert_array_equal(tr.dense, r["dense"])
    np.testing.assert_array_equal(tr.sparse, r["sparse"])
    np.testing.assert_array_equal(tr.request_ids, r["request_ids"])
    assert tr.sparse.dtype == np.int32 and tr.probs is None and tr.bayes_ne is None
    assert tr.ctr == pytest.approx(float(np.mean(r["labels"])))
    assert tr.n_requests == 60 == len(set(r["request_ids"].tolist()))
    assert len(d.split("val")) == 0
    # the spec comes back with each dense column's training mean and std (numpy's, population std)
    x = r["dense"].astype(np.float64)
    assert [f.mean for f in d.spec.dense] == pytest.approx(x.mean(axis=0).tolist(), rel=1e-9)
    assert [f.std for f in d.spec.dense] == pytest.approx(x.std(axis=0).tolist(), rel=1e-9)
    assert d.spec.sparse == SPEC.sparse and [f.name for f in d.spec.dense] == ["d0", "d1"]


def test_a_constant_dense_column_is_centred_only(tmp_path) -> None:
    r = _rows(10, 1)
    r["dense"][:, 1] = 7.0
    n = len(r["labels"])
    with StoreWriter(tmp_path / "d", SPEC, {"train": n, "val": 0, "test": 0}) as w:
        w.write("train", *(r[k] for k in ("dense", "sparse", "labels", "request_ids")))
        d = w.close({"source": "test"})
    assert (d.spec.dense[1].mean, d.spec.dense[1].std) == (pytest.approx(7.0), 1.0)


def test_a_store_of_an_older_format_is_rebuilt_by_the_cache(tmp_path) -> None:
    import json

    from rankitect.data.store import cached

    r = _rows(10, 2)
    n = len(r["labels"])

    def build(out):
        with StoreWriter(out, SPEC, {"train": n, "val": 0, "test": 0}) as w:
            w.write("train", *(r[k] for k in ("dense", "sparse", "labels", "request_ids")))
            return w.close({"source": "test", "cache_key": "k"})

    out = tmp_path / "cache" / "d"
    cached(out, "k", build)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "format_version": 1}))  # as an older release wrote it
    with pytest.raises(DataError, match="version 1"):
        ClickData.open(out)
    assert cached(out, "k", build).spec.dense[0].std != 1.0  # rebuilt, not refused


def test_batches_in_order(data) -> None:
    d, r = data
    batches = list(d.split("train").batches(32, shuffle=False))
    n = len(r["labels"])
    assert [len(b) for b in batches] == [32] * (n // 32) + ([n % 32] if n % 32 else [])
    b = batches[1]
    np.testing.assert_array_equal(b.sparse_ids().numpy(), r["sparse"][32:64])
    np.testing.assert_array_equal(b.sparse["s"].values().numpy(), r["sparse"][32:64, 1])
    np.testing.assert_allclose(b.dense.numpy(), r["dense"][32:64])
    assert len(list(d.split("train").batches(32, shuffle=False, drop_last=True))) == n // 32


def test_merge_last_joins_a_short_final_batch_to_the_one_before(data) -> None:
    d, r = data
    n = len(r["labels"])
    for size in (32, 7, n - 1, n, n + 5):
        naive = [r["sparse"][i:i + size, 1] for i in range(0, n, size)]  # plain slicing
        if len(naive) > 1 and len(naive[-1]) < size:
            naive[-2:] = [np.concatenate(naive[-2:])]
        merged = list(d.split("train").batches(size, shuffle=False, merge_last=True))
        assert [len(b) for b in merged] == [len(x) for x in naive]
        for got, want in zip(merged, naive):
            np.testing.assert_array_equal(got.sparse["s"].values().numpy(), want)
        assert all(len(b) >= size for b in merged) or len(merged) == 1
    shuffled = list(d.split("train").batches(7, shuffle=True, seed=3, merge_last=True))
    rows = np.concatenate([b.sparse["s"].values().numpy() for b in shuffled])
    assert sorted(rows.tolist()) == sorted(r["sparse"][:, 1].tolist())  # every row once
    assert min(len(b) for b in shuffled) >= 7 and len(shuffled) == n // 7


def test_shuffle_permutes_requests_not_rows(data) -> None:
    d, r = data
    tr = d.split("train")
    batches = list(tr.batches(16, shuffle=True, seed=5))
    rid = np.concatenate([b.request_ids.numpy() for b in batches])
    col = np.concatenate([b.sparse_ids()[:, 1].numpy() for b in batches])
    assert sorted(col.tolist()) == sorted(r["sparse"][:, 1].tolist())  # every row exactly once
    runs = rid[np.r_[True, rid[1:] != rid[:-1]]]
    assert len(runs) == len(set(runs.tolist())) == 60  # each request one contiguous run
    assert not np.array_equal(runs, np.unique(runs))  # and the requests were reordered
    for q in runs[:5]:  # rows of a request keep their stored order
        np.testing.assert_array_equal(col[rid == q], r["sparse"][r["request_ids"] == q, 1])
    again = np.concatenate([b.request_ids.numpy() for b in tr.batches(16, shuffle=True, seed=5)])
    other = np.concatenate([b.request_ids.numpy() for b in tr.batches(16, shuffle=True, seed=6)])
    assert np.array_equal(rid, again) and not np.array_equal(rid, other)


def test_writer_checks_sizes_and_cleans_up(tmp_path) -> None:
    r = _rows(5, 1)
    n = len(r["labels"])
    w = StoreWriter(tmp_path / "d", SPEC, {"train": n + 1, "val": 0, "test": 0})
    w.write("train", r["dense"], r["sparse"], r["labels"], r["request_ids"])
    with pytest.raises(ValueError, match="declared"):
        w.close({})
    assert list(tmp_path.iterdir()) == []  # no half-written directory left
    with StoreWriter(tmp_path / "d", SPEC, {"train": 1, "val": 0, "test": 0}) as w:
        with pytest.raises(ValueError, match="past"):
            w.write("train", r["dense"], r["sparse"], r["labels"], r["request_ids"])
        bad = r["sparse"][:1] + 50
        with pytest.raises(ValueError, match="outside"):
            w.write("train", r["dense"][:1], bad, r["labels"][:1], r["request_ids"][:1])


def test_refuses_foreign_directories(tmp_path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "precious.txt").write_text("keep me")
    r = _rows(2, 2)
    n = len(r["labels"])
    w = StoreWriter(tmp_path / "x", SPEC, {"train": n, "val": 0, "test": 0})
    w.write("train", r["dense"], r["sparse"], r["labels"], r["request_ids"])
    with pytest.raises(DataError, match="not a rankitect data directory"):
        w.close({})
    assert (tmp_path / "x" / "precious.txt").read_text() == "keep me"
    with pytest.raises(DataError, match="no such data directory"):
        ClickData.open(tmp_path / "missing")
    with pytest.raises(DataError, match="not a rankitect data directory"):
        ClickData.open(tmp_path / "x")
