"""The Criteo reader on the real 200-row sample and on small broken files."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankitect.data import criteo
from rankitect.data.criteo import read_criteo
from rankitect.errors import DataError
from tests.paths import CRITEO_SAMPLE

SAMPLE = CRITEO_SAMPLE
SPLITS = ("train", "val", "test")


def _raw_lines() -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in SAMPLE.read_text().splitlines()]


def _row(data, k: int) -> dict[str, np.ndarray]:
    """Row ``k`` of the file (request id == 0-based row number), wherever its split put it."""
    for s in SPLITS:
        sp = data.split(s)
        hit = np.flatnonzero(np.asarray(sp.request_ids) == k)
        if len(hit):
            i = int(hit[0])
            return {"label": sp.labels[i], "dense": sp.dense[i], "sparse": sp.sparse[i]}
    raise KeyError(k)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return read_criteo(SAMPLE, tmp_path_factory.mktemp("c") / "d", vocab_size=1000, progress=False)


def test_sample_counts(sample) -> None:
    rows = sum(len(sample.split(s)) for s in SPLITS)
    positives = sum(int(np.sum(sample.split(s).labels)) for s in SPLITS)
    assert (rows, positives) == (200, 49)
    assert (sample.spec.n_dense, sample.spec.n_sparse) == (13, 26)
    assert all(f.side == "candidate" and f.vocab_size == 1000 for f in sample.spec.sparse)
    assert sample.split("train").n_requests == len(sample.split("train"))  # one row per request


@pytest.mark.parametrize("k", [0, 1, 4, 57, 199])
def test_values_match_the_raw_text(sample, k) -> None:
    fields = _raw_lines()[k]
    got = _row(sample, k)
    assert got["label"] == float(fields[0])
    want_dense = [math.log(1 + max(int(x), 0)) if x else 0.0 for x in fields[1:14]]
    np.testing.assert_allclose(got["dense"], want_dense, rtol=1e-6)
    for j, value in enumerate(fields[14:40]):
        if value == "":
            assert got["sparse"][j] == 0
        else:  # the documented rule: 1 + SipHash(value, key = column number) mod (vocab_size - 1)
            h = pd.util.hash_array(np.array([value], dtype=object), hash_key=f"{j + 1:016d}", categorize=False)[0]
            assert got["sparse"][j] == 1 + int(h) % 999


def test_equal_strings_get_equal_ids(sample) -> None:
    lines = _raw_lines()
    col = 14 + 8  # C9 has few distinct values
    by_value: dict[str, set] = {}
    for k, fields in enumerate(lines):
        by_value.setdefault(fields[col], set()).add(int(_row(sample, k)["sparse"][8]))
    assert all(len(ids) == 1 for ids in by_value.values())
    assert len({next(iter(v)) for v in by_value.values()}) == len(by_value)


def test_chunking_crlf_and_blank_lines_change_nothing(sample, tmp_path) -> None:
    text = SAMPLE.read_bytes()
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(text.replace(b"\n", b"\r\n").rstrip(b"\r\n") + b"\r\n\r\n")  # and a trailing blank line
    other = read_criteo(crlf, tmp_path / "o", vocab_size=1000, progress=False, chunk_bytes=997)
    for s in SPLITS:
        for key in ("dense", "sparse", "labels", "request_ids"):
            np.testing.assert_array_equal(getattr(other.split(s), key), getattr(sample.split(s), key))


def test_second_call_uses_the_cache(tmp_path, monkeypatch) -> None:
    path = tmp_path / "s.tsv"
    path.write_bytes(SAMPLE.read_bytes())
    first = read_criteo(path, vocab_size=500, progress=False, cache_dir=tmp_path / "cache")

    def no_reading(*args, **kwargs):
        raise AssertionError("the TSV was read again")

    monkeypatch.setattr(criteo, "_iter_blocks", no_reading)
    again = read_criteo(path, vocab_size=500, progress=False, cache_dir=tmp_path / "cache")
    assert again.path == first.path
    os.utime(path, ns=(1, 1))  # the file changed: the key changes, parsing starts again
    with pytest.raises(AssertionError, match="read again"):
        read_criteo(path, vocab_size=500, progress=False, cache_dir=tmp_path / "cache")


def test_min_count_vocabulary_counts_train_rows_only(tmp_path) -> None:
    data = read_criteo(SAMPLE, tmp_path / "m", min_count=3, vocab_size=1000, progress=False)
    lines = _raw_lines()
    train_rows = set(np.asarray(data.split("train").request_ids).tolist())
    for j in (0, 8, 20):  # C1, C9, C21
        counts: dict[str, int] = {}
        for k in train_rows:
            v = lines[k][14 + j]
            if v:
                counts[v] = counts.get(v, 0) + 1
        kept = {v for v, c in counts.items() if c >= 3}
        assert data.spec.sparse[j].vocab_size == 2 + len(kept)
        id_of: dict[str, int] = {}
        for k in range(200):
            v, got = lines[k][14 + j], int(_row(data, k)["sparse"][j])
            if v == "":
                assert got == 0
            elif v in kept:
                assert got >= 2 and id_of.setdefault(v, got) == got
            else:  # rare in train, or only seen in val / test
                assert got == 1
        assert len(set(id_of.values())) == len(kept)


def _line(label: str = "1", ints: list[str] | None = None) -> str:
    ints = ints if ints is not None else ["1"] * 13
    return "\t".join([label, *ints, *(["a1b2c3d4"] * 26)]) + "\n"


@pytest.mark.parametrize(("lines", "line_no", "match"), [
    ([_line(), _line(), _line()[:-20] + "\n"], 3, "wrong number of columns"),
    ([_line(), _line(ints=["1"] * 5 + ["x7"] + ["1"] * 7)], 2, r"column 7 \(I6\): 'x7' is not a number"),
    ([_line(), _line(), _line(label="2")], 3, r"label must be 0 or 1, got 2\.0$"),  # no numpy repr
    ([_line(), "\n", _line(label="")], 3, "label must be 0 or 1"),
    ([_line(), _line(ints=["1"] * 2 + ["inf"] + ["1"] * 10)], 2, r"column 4 \(I3\): inf is not a finite number"),
    ([_line(ints=["-Infinity"] + ["1"] * 12)], 1, r"column 2 \(I1\): -inf is not a finite number"),
    ([_line(), _line(ints=["1"] * 12 + ["1e400"])], 2, r"column 14 \(I13\): inf is not a finite number"),
    ([_line(), _line(ints=["nan"] + ["1"] * 12)], 2, r"column 2 \(I1\): 'nan' is not a finite number"),
])
def test_bad_input_names_file_and_line(tmp_path, lines, line_no, match) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("".join(lines))
    with pytest.raises(DataError, match=match) as e:
        read_criteo(path, tmp_path / "out", progress=False)
    assert (e.value.path, e.value.line) == (str(path), line_no)
    assert not (tmp_path / "out").exists()


def test_empty_and_missing_files(tmp_path) -> None:
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(DataError, match="empty file"):
        read_criteo(tmp_path / "empty.tsv", tmp_path / "o", progress=False)
    with pytest.raises(DataError, match="no such file"):
        read_criteo(tmp_path / "nope.tsv", tmp_path / "o", progress=False)
