"""History (sequence) columns: the spec, batches, the tabular reader and the planted synthetic signal."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rankitect.data.batch import concat_batches, make_batch, padded_history
from rankitect.data.history import raw_bound
from rankitect.data.spec import FeatureSpec, SequenceFeature, SparseFeature
from rankitect.data.tabular import read_tabular
from rankitect.errors import DataError

SCHEMA = """\
label: clicked
sparse: [user, item]
request: [user]
request_id: session
history:
  - name: clicks
    max_len: 4
    shares: item
"""


def test_a_spec_without_history_serializes_as_before_and_one_with_it_round_trips() -> None:
    plain = FeatureSpec(dense=(), sparse=(SparseFeature("item", 10),))
    assert set(plain.to_dict()) == {"name", "label", "dense", "sparse", "extra"}
    spec = FeatureSpec(dense=(), sparse=(SparseFeature("item", 10),), sequence=(SequenceFeature("h", 5, 10, "item"),))
    assert FeatureSpec.from_dict(spec.to_dict()) == spec and spec != plain
    with pytest.raises(ValueError, match="shares 'nope', which is no sparse feature"):
        FeatureSpec(dense=(), sparse=(SparseFeature("item", 10),), sequence=(SequenceFeature("h", 5, 10, "nope"),))
    with pytest.raises(ValueError, match="differs from the 10 of 'item'"):
        FeatureSpec(dense=(), sparse=(SparseFeature("item", 10),), sequence=(SequenceFeature("h", 5, 9, "item"),))


def test_padded_history_is_right_aligned_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(1, 50, rng.integers(0, 9))) for _ in range(30)]
    values = torch.tensor([v for r in rows for v in r], dtype=torch.int64)
    lengths = torch.tensor([len(r) for r in rows])
    ids, mask = padded_history(values, lengths, 6)
    for b, r in enumerate(rows):
        kept = r[-6:]
        expect = [0] * (6 - len(kept)) + kept
        assert ids[b].tolist() == expect and mask[b].tolist() == [False] * (6 - len(kept)) + [True] * len(kept)


def test_batches_carry_histories_through_concatenation() -> None:
    a = make_batch(np.zeros((2, 0)), np.ones((2, 1)), np.zeros(2), np.arange(2), keys=["s"],
                   history={"h": (np.array([[0, 3], [4, 5]]), np.array([1, 2]))})
    b = make_batch(np.zeros((1, 0)), np.ones((1, 1)), np.zeros(1), np.arange(1), keys=["s"],
                   history={"h": (np.array([[0, 0, 7]]), np.array([1]))})
    ids, mask = concat_batches([a, b]).history_padded("h", 3)
    assert ids.tolist() == [[0, 0, 3], [0, 4, 5], [0, 0, 7]] and mask.sum(1).tolist() == [1, 2, 1]


def _frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    session = np.repeat(np.arange(60), 3)
    n = len(session)
    histories = {s: "|".join(str(i) for i in rng.integers(1, 12, rng.integers(0, 7))) for s in range(60)}
    return pd.DataFrame({"clicked": rng.integers(0, 2, n), "user": [f"u{s % 5}" for s in session],
                         "item": rng.integers(1, 12, n), "session": session,
                         "clicks": [histories[s] for s in session]})


def _rows(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """request ids, sparse ids, history ids and lengths of every split, concatenated."""
    parts = [data.split(s) for s in ("train", "val", "test")]
    return (np.concatenate([np.asarray(p.request_ids) for p in parts]),
            np.concatenate([np.asarray(p.sparse) for p in parts]),
            np.concatenate([np.asarray(p.history["clicks"][0]) for p in parts]),
            np.concatenate([np.asarray(p.history["clicks"][1]) for p in parts]))


@pytest.mark.parametrize("vocab", ["train", "hash"])
def test_a_shared_history_gets_the_candidate_columns_ids_latest_kept(tmp_path: Path, vocab: str) -> None:
    from rankitect.data.hashing import buckets, hash_strings

    df = _frame()
    df.to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text(SCHEMA + f"vocab: {vocab}\nvocab_size: 40\n")
    data = read_tabular(tmp_path / "x.csv", tmp_path / "s.yaml", tmp_path / "out")
    assert data.spec.sequence == (SequenceFeature("clicks", 4, data.spec.sparse[1].vocab_size, shares="item"),)
    rid, sparse, hist, lengths = _rows(data)
    seen: dict[int, int] = {}
    file_rows = []  # the file row of each stored row: sessions are sorted, 3 rows each, kept in file order
    for q in rid:
        file_rows.append(3 * int(q) + seen.get(int(q), 0))
        seen[int(q)] = seen.get(int(q), 0) + 1
    item_id = {int(df["item"][r]): int(sparse[k, 1]) for k, r in enumerate(file_rows)}  # the candidate column's ids
    for k, r in enumerate(file_rows):
        cell = df["clicks"][r]
        kept = [int(t) for t in cell.split("|")][-4:] if isinstance(cell, str) and cell else []
        assert lengths[k] == len(kept) and not hist[k][: 4 - len(kept)].any()
        for raw, got in zip(kept, hist[k][4 - len(kept):].tolist()):
            if raw in item_id:
                assert got == item_id[raw]  # the same item, the same id
            elif vocab == "train":
                assert got == 1  # never a training candidate: out of vocabulary
            else:
                assert got == int(buckets(hash_strings(np.array([str(raw)], dtype=object), salt=2), 40)[0])


def test_csv_and_parquet_histories_agree_and_empty_ones_are_length_zero(tmp_path: Path) -> None:
    df = _frame(1)
    df.loc[df["session"] == 3, "clicks"] = ""
    df.to_csv(tmp_path / "x.csv", index=False)
    lists = df.copy()
    lists["clicks"] = [[int(t) for t in str(c).split("|") if t and t != "nan"] for c in df["clicks"]]
    lists.to_parquet(tmp_path / "x.parquet")
    (tmp_path / "s.yaml").write_text(SCHEMA)
    a = read_tabular(tmp_path / "x.csv", tmp_path / "s.yaml", tmp_path / "a")
    b = read_tabular(tmp_path / "x.parquet", tmp_path / "s.yaml", tmp_path / "b")
    for x, y in zip(_rows(a), _rows(b)):
        np.testing.assert_array_equal(x, y)
    assert (_rows(a)[3] == 0).any()


@pytest.mark.parametrize(("cell", "says"), [("3|x|4", "holds an id that is not an integer"),
                                            ("3|2.5", "holds an id that is not an integer"),
                                            ("|".join(["1"] * (raw_bound(4) + 1)), "a corrupt field")])
def test_a_bad_history_names_file_line_and_column_and_writes_nothing(tmp_path: Path, cell: str, says: str) -> None:
    df = _frame()
    df["clicks"] = df["clicks"].astype(object)
    df.loc[df["session"] == 2, "clicks"] = cell  # session 2: rows 6..8, CSV lines 8..10
    df.to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text(SCHEMA)
    with pytest.raises(DataError, match=says) as e:
        read_tabular(tmp_path / "x.csv", tmp_path / "s.yaml", tmp_path / "cache" / "out")
    assert (e.value.path, e.value.line) == (str(tmp_path / "x.csv"), 8) and "'clicks'" in str(e.value)
    assert not (tmp_path / "cache" / "out").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["out.lock"]  # no data, no half-written directory


def test_shares_naming_no_sparse_column_names_the_schema_line(tmp_path: Path) -> None:
    _frame().to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text(SCHEMA.replace("shares: item", "shares: itme"))
    with pytest.raises(DataError, match=r"history\[0\].shares: 'itme' is no sparse column") as e:
        read_tabular(tmp_path / "x.csv", tmp_path / "s.yaml", tmp_path / "out")
    assert (e.value.path, e.value.line) == (str(tmp_path / "s.yaml"), 8)


def test_a_history_that_changes_within_a_request_is_refused(tmp_path: Path) -> None:
    df = _frame()
    df.loc[4, "clicks"] = "9|9|9"
    df.to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text(SCHEMA)
    with pytest.raises(DataError, match="'clicks' changes within a request") as e:
        read_tabular(tmp_path / "x.csv", tmp_path / "s.yaml", tmp_path / "out")
    assert e.value.line is not None


def test_the_history_log_knows_its_bayes_ne_and_plants_its_signal(tmp_path: Path) -> None:
    from rankitect.data.synthetic_categorical import ITEM, CategoricalTeacher, generate_categorical

    data = generate_categorical(tmp_path / "h", rows=6000, seed=2, history=8)
    plain = generate_categorical(tmp_path / "p", rows=6000, seed=2)
    teacher = CategoricalTeacher(2, history=8)
    category = teacher.catalog[7]  # item id -> category
    val = data.split("val")
    ids, lengths = np.asarray(val.history["item_history"][0]), np.asarray(val.history["item_history"][1])
    items = np.asarray(val.sparse)[:, ITEM]
    overlap = []
    for h, n, item in zip(ids, lengths, items):  # the overlap term, one row at a time
        kept = [int(x) for x in h[len(h) - n:]] if n else []
        share = sum(category[x] == category[item] for x in kept) / max(n, 1)
        overlap.append(share + (item in kept))
    others = teacher.term_scale[:4] @ teacher.terms(_rows_of(val))[:4]
    logit = teacher.bias + others + teacher.term_scale[4] * np.array(overlap)
    np.testing.assert_allclose(np.asarray(val.probs), 1 / (1 + np.exp(-logit)), rtol=1e-5, atol=1e-7)
    assert val.bayes_ne < plain.split("val").bayes_ne - 0.05  # the history carries signal
    assert (lengths == 0).any() and lengths.max() == 8
    assert "history" not in plain.meta["params"] and data.meta["params"]["history"] == 8
    assert math.isfinite(val.bayes_ne)


def _rows_of(split):
    from rankitect.data.synthetic import _Rows

    h, n = split.history["item_history"]
    return _Rows(np.zeros((len(split), 0)), np.asarray(split.sparse).astype(np.int64), np.asarray(split.request_ids),
                 np.zeros(len(split)), np.asarray(h).astype(np.int64), np.asarray(n).astype(np.int64))


@pytest.mark.parametrize(("cell", "schema", "says", "where"), [
    ("3|x|4", SCHEMA, "holds an id that is not an integer", "x.csv:8:"),
    ("|".join(["1"] * (raw_bound(4) + 1)), SCHEMA, "a corrupt field", "x.csv:8:"),
    (None, SCHEMA.replace("shares: item", "shares: itme"), "'itme' is no sparse column", "s.yaml:8:"),
])
def test_a_search_on_a_bad_history_exits_2_naming_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str], cell, schema,
                                                                says: str, where: str) -> None:
    from rankitect.cli import main

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    df = _frame()
    df["clicks"] = df["clicks"].astype(object)
    if cell is not None:
        df.loc[df["session"] == 2, "clicks"] = cell
    df.to_csv(tmp_path / "x.csv", index=False)
    (tmp_path / "s.yaml").write_text(schema)
    assert main(["search", f"data.source={tmp_path / 'x.csv'}", f"data.schema={tmp_path / 's.yaml'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rankitect: error: ") and where in err[0] and says in err[0], err
    assert not (tmp_path / "mlruns").exists()  # no run opened
    written = [p.name for p in (tmp_path / "cache").iterdir()] if (tmp_path / "cache").exists() else []
    assert all(name.endswith(".lock") for name in written), written  # no data directory, whole or half
