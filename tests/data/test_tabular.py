"""The tabular reader: CSV and parquet with a schema YAML, requests, vocabularies, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankitect.data.tabular import read_tabular
from rankitect.errors import DataError

SPLITS = ("train", "val", "test")
SCHEMA = """\
label: clicked
dense: [price]
sparse: [user, item]
request: [user]
request_id: session
"""


def _frame(n_sessions: int = 40, seed: int = 0) -> pd.DataFrame:
    """Sessions of 1..4 rows, rows of a session scattered through the file; user fixed per session."""
    rng = np.random.default_rng(seed)
    session = np.repeat(np.arange(n_sessions), rng.integers(1, 5, n_sessions))
    rng.shuffle(session)
    n = len(session)
    item = pd.array(rng.integers(0, 9, n), dtype="Int64")
    item[3] = pd.NA
    price = rng.random(n)
    price[5] = np.nan
    return pd.DataFrame({"clicked": rng.integers(0, 2, n), "price": price, "user": [f"u{s % 6}" for s in session],
                         "item": item, "session": [f"s{s}" for s in session]})


@pytest.fixture()
def files(tmp_path) -> tuple[Path, Path, Path, pd.DataFrame]:
    df = _frame()
    df.to_csv(tmp_path / "x.csv", index=False)
    df.to_parquet(tmp_path / "x.parquet")
    (tmp_path / "s.yaml").write_text(SCHEMA)
    return tmp_path / "x.csv", tmp_path / "x.parquet", tmp_path / "s.yaml", df


def _all(data, key: str) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(data.split(s), key)) for s in SPLITS])


def test_csv_and_parquet_agree(files, tmp_path) -> None:
    csv, parquet, schema, df = files
    a, b = read_tabular(csv, schema, tmp_path / "a"), read_tabular(parquet, schema, tmp_path / "b")
    for key in ("dense", "sparse", "labels", "request_ids"):
        np.testing.assert_array_equal(_all(a, key), _all(b, key))
    assert a.spec == b.spec
    assert [f.side for f in a.spec.sparse] == ["request", "candidate"]
    assert sum(len(a.split(s)) for s in SPLITS) == len(df)
    assert float(_all(a, "labels").sum()) == float(df["clicked"].sum())
    expected = _signed_log1p(df["price"].fillna(0).to_numpy())  # the default dense transform
    np.testing.assert_allclose(sorted(_all(a, "dense")[:, 0].tolist()), sorted(expected.tolist()), rtol=1e-6)


def test_requests_are_gathered_and_split_whole(files, tmp_path) -> None:
    csv, _, schema, df = files
    data = read_tabular(csv, schema, tmp_path / "a")
    per_split = []
    for s in SPLITS:
        sp = data.split(s)
        rid = np.asarray(sp.request_ids)
        assert sp.n_requests == len(set(rid.tolist()))  # each request is one contiguous run
        starts = sp.request_starts()
        first_row = np.repeat(starts[:-1], np.diff(starts))
        np.testing.assert_array_equal(sp.sparse[:, 0], sp.sparse[first_row, 0])  # request side is shared
        per_split.append(set(rid.tolist()))
    assert sum(len(s) for s in per_split) == len(set().union(*per_split)) == df["session"].nunique()
    # request ids number the sessions in order of first appearance; rows stay in file order inside one
    first_session = df["session"].iloc[0]
    rows = df[df["session"] == first_session]
    where = next(s for s in SPLITS if 0 in set(np.asarray(data.split(s).request_ids).tolist()))
    sp = data.split(where)
    got = np.asarray(sp.dense)[np.asarray(sp.request_ids) == 0, 0]
    np.testing.assert_allclose(got, _signed_log1p(rows["price"].fillna(0).to_numpy()), rtol=1e-6)


def _signed_log1p(x: np.ndarray) -> np.ndarray:
    """The textbook signed log transform: sign(x) * ln(1 + |x|)."""
    return np.array([math.copysign(math.log(1 + abs(v)), v) for v in x])


def test_dense_transform_none_keeps_values_as_read(files, tmp_path) -> None:
    csv, _, schema, df = files
    raw = tmp_path / "raw.yaml"
    raw.write_text(schema.read_text() + "dense_transform: none\n")
    data = read_tabular(csv, raw, tmp_path / "r")
    got = sorted(_all(data, "dense")[:, 0].tolist())
    assert got == sorted(df["price"].fillna(0).astype(np.float32).tolist())


def test_train_vocabulary(files, tmp_path) -> None:
    csv, _, schema, df = files
    data = read_tabular(csv, schema, tmp_path / "a")
    tr = data.split("train")
    item_ids = np.asarray(tr.sparse[:, 1])
    codes = pd.factorize(df["session"])[0]
    train_rows = np.isin(codes, np.asarray(tr.request_ids))
    counts = df.loc[train_rows, "item"].value_counts()
    assert data.spec.sparse[1].vocab_size == 2 + len(counts)
    # most frequent train value gets id 2; missing gets 0
    order = np.argsort(codes[train_rows], kind="stable")
    values = df.loc[train_rows, "item"].to_numpy()[order]
    top = counts.index[0] if counts.iloc[0] > counts.iloc[1] else None
    if top is not None:
        assert set(item_ids[values == top].tolist()) == {2}
    assert set(item_ids[pd.isna(values)].tolist()) <= {0}
    assert set(item_ids[~pd.isna(values)].tolist()) <= set(range(2, 2 + len(counts)))


def test_hash_vocabulary(tmp_path) -> None:
    df = pd.DataFrame({"y": [0, 1, 1, 0], "c": ["a", "b", "a", None]})
    df.to_csv(tmp_path / "h.csv", index=False)
    (tmp_path / "h.yaml").write_text("label: y\nsparse: [c]\nvocab: hash\nvocab_size: 50\nfractions: [1, 0, 0]\n")
    data = read_tabular(tmp_path / "h.csv", tmp_path / "h.yaml", tmp_path / "o")
    ids = np.asarray(data.split("train").sparse[:, 0])
    h = pd.util.hash_array(np.array(["a", "b"], dtype=object), hash_key=f"{1:016d}", categorize=False)
    ha, hb = (1 + int(x) % 49 for x in h)
    assert ids.tolist() == [ha, hb, ha, 0] and data.spec.sparse[0].vocab_size == 50


@pytest.mark.parametrize(("schema", "match"), [
    (SCHEMA + "colour: red\n", "unknown schema key 'colour'"),
    (SCHEMA.replace("[price]", "[price, weight]"), "dense: column 'weight' not in"),
    (SCHEMA.replace("session\n", "visit\n"), "request_id: column 'visit' not in"),
    ("- just\n- a list\n", "a schema must be a mapping"),
    ("dense: [price]\n", "label: the label column name is required"),
    (SCHEMA + "vocab: magic\n", "vocab: must be 'train' or 'hash'"),
    (SCHEMA.replace("request: [user]", "request: [city]"), "request: columns"),
])
def test_bad_schema_names_the_schema_file_and_key(files, schema, match) -> None:
    csv, _, schema_path, _ = files
    schema_path.write_text(schema)
    with pytest.raises(DataError, match=match) as e:
        read_tabular(csv, schema_path, schema_path.parent / "o")
    assert e.value.path == str(schema_path)


def test_bad_values_name_the_data_line(files) -> None:
    csv, _, schema, df = files
    bad = df.copy()
    bad.loc[4, "clicked"] = 3
    bad.to_csv(csv, index=False)
    with pytest.raises(DataError, match="must be 0 or 1, got 3$") as e:  # the value, not a numpy repr
        read_tabular(csv, schema, csv.parent / "o")
    assert (e.value.path, e.value.line) == (str(csv), 6)  # header is line 1, row 4 is line 6
    bad = df.copy()
    bad["user"] = [f"u{i}" for i in range(len(df))]  # user varies within a session
    bad.to_csv(csv, index=False)
    with pytest.raises(DataError, match="'user' is listed under 'request' but changes"):
        read_tabular(csv, schema, csv.parent / "o")
    bad = df.copy()
    bad["price"] = bad["price"].astype(object)
    bad.loc[2, "price"] = "cheap"
    bad.to_csv(csv, index=False)
    with pytest.raises(DataError, match="'cheap' is not a number") as e:
        read_tabular(csv, schema, csv.parent / "o")
    assert e.value.line == 4
