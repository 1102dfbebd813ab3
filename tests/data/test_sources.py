"""open_data dispatch and describe."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from rankitect.data import describe, open_data
from rankitect.errors import DataError
from tests.paths import CRITEO_SAMPLE

SAMPLE = CRITEO_SAMPLE


@dataclass
class Options:
    rows: int = 1200
    seed: int = 4
    schema: str | None = None
    vocab_size: int = 300
    cache_dir: str | None = None


def test_synthetic_and_its_directory(tmp_path) -> None:
    data = open_data("synthetic", Options(cache_dir=str(tmp_path)))
    assert data.meta["params"]["rows"] == 1200 and data.meta["params"]["seed"] == 4
    assert data.path.parent == tmp_path
    again = open_data(str(data.path))
    assert again.path == data.path and again.spec == data.spec
    d = describe(again)
    assert d["rows"] == 1200 == sum(s["rows"] for s in d["splits"].values())
    assert d["splits"]["val"]["bayes_ne"] == pytest.approx(data.split("val").bayes_ne)
    sides = {f["name"]: f["side"] for f in d["features"]}
    assert sides["I1"] == "request" and sides["C26"] == "candidate"
    assert {f["vocab_size"] for f in d["features"] if f["kind"] == "dense"} == {None}


def test_criteo_and_tabular_files(tmp_path) -> None:
    crit = open_data(str(SAMPLE), Options(cache_dir=str(tmp_path / "cache")))
    assert crit.source == "criteo" and {f.vocab_size for f in crit.spec.sparse} == {300}
    assert describe(crit)["splits"]["train"]["bayes_ne"] is None
    pd.DataFrame({"y": [0, 1, 0], "a": ["x", "y", "x"]}).to_csv(tmp_path / "t.csv", index=False)
    (tmp_path / "t.schema.yaml").write_text("label: y\nsparse: [a]\n")  # found next to the file
    tab = open_data(str(tmp_path / "t.csv"), cache_dir=tmp_path / "cache")
    assert tab.source == "tabular" and tab.spec.sparse_names == ["a"]


@pytest.mark.parametrize(("name", "match"), [
    ("missing.tsv", "no such file"),
    ("data.json", "unknown data format"),
    ("lonely.csv", "needs a schema"),
    ("folder", "not a rankitect data directory"),
])
def test_bad_sources(tmp_path, name, match) -> None:
    (tmp_path / "data.json").write_text("{}")
    (tmp_path / "lonely.csv").write_text("y\n1\n")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match=match):
        open_data(str(tmp_path / name), cache_dir=tmp_path / "cache")
