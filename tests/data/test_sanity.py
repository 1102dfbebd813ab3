"""Data that cannot train a model, or that the readers would quietly bend, is refused by name:
one-label splits, ragged CSV lines, infinite dense values, pickled arrays in a data directory."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from rankitect.data import open_data
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.data.store import StoreWriter
from rankitect.data.tabular import read_tabular
from rankitect.errors import DataError

SCHEMA = "label: y\ndense: [a, b]\nsparse: [c]\n"


def _csv(folder: Path, lines: list[str], name: str = "d") -> tuple[Path, Path]:
    path, schema = folder / f"{name}.csv", folder / f"{name}.schema.yaml"
    path.write_text("y,a,b,c\n" + "".join(line + "\n" for line in lines))
    schema.write_text(SCHEMA)
    return path, schema


def _rows(n: int, labels: list[int] | None = None) -> list[str]:
    labels = labels if labels is not None else [i % 2 for i in range(n)]
    return [f"{labels[i]},{i},{i * 0.5},k{i % 3}" for i in range(n)]


@pytest.mark.parametrize(("line", "fields"), [("1,2", 2), ("1,2,3,k1,9", 5), ("", None)])
def test_a_ragged_line_is_named_by_file_and_line(tmp_path: Path, line: str, fields: int | None) -> None:
    rows = _rows(30)
    rows.insert(6, line)  # the 8th line of the file (header + 6 rows before it)
    path, schema = _csv(tmp_path, rows)
    if fields is None:  # a blank line is no row: skipped as pandas skips it
        assert sum(len(read_tabular(path, schema, tmp_path / "o").split(s)) for s in ("train", "val", "test")) == 30
        return
    with pytest.raises(DataError) as err:
        read_tabular(path, schema, tmp_path / "o")
    assert (err.value.path, err.value.line) == (str(path), 8)
    assert f"{fields} fields, expected 4" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_quoted_fields_are_counted_as_the_csv_rules_say(tmp_path: Path) -> None:
    rows = _rows(20)
    rows[2] = '1,2,3,"k,with comma"'  # 4 fields though 5 commas
    rows[9] = '0,2,"3'  # a quote left open: the rest of the file is one field
    path, schema = _csv(tmp_path, rows)
    with pytest.raises(DataError) as err:
        read_tabular(path, schema, tmp_path / "o")
    assert err.value.path == str(path) and err.value.line is not None and err.value.line >= 11
    rows[9] = '0,2,3,"k\nnext"'  # a newline inside quotes is part of the field
    path, schema = _csv(tmp_path, rows, "e")
    assert read_tabular(path, schema, tmp_path / "e_out").spec.n_dense == 2


@pytest.mark.parametrize("value", ["inf", "-inf", "1e400", "Infinity"])
def test_an_infinite_dense_value_is_refused_naming_line_and_column(tmp_path: Path, value: str) -> None:
    rows = _rows(30)
    rows[4] = f"1,3,{value},k1"
    path, schema = _csv(tmp_path, rows)
    with pytest.raises(DataError, match=r"column 'b': -?inf is not a finite number") as err:
        read_tabular(path, schema, tmp_path / "o")
    assert (err.value.path, err.value.line) == (str(path), 6)


def test_nan_is_missing_and_missing_is_zero_before_the_transform(tmp_path: Path) -> None:
    rows = _rows(30)
    rows[4] = "1,nan,,k1"
    path, schema = _csv(tmp_path, rows)
    data = read_tabular(path, schema, tmp_path / "o")
    dense = np.concatenate([np.asarray(data.split(s).dense) for s in ("train", "val", "test")])
    assert np.isfinite(dense).all()
    # the stored arrays are raw log1p values: a zero row exists exactly where the missing ones were
    assert ((dense == 0).all(axis=1)).sum() == 2  # row 0 (0, 0.0) and row 4 (missing, missing)


def _data_dir(out: Path, labels: dict[str, list[int]]) -> Path:
    spec = FeatureSpec(dense=(DenseFeature("d0"),), sparse=(SparseFeature("s0", 5),), name="t")
    rows = {k: len(v) for k, v in labels.items()}
    with StoreWriter(out, spec, rows) as w:
        start = 0
        for split, ys in labels.items():
            n = len(ys)
            w.write(split, np.ones((n, 1)), np.ones((n, 1), dtype=np.int64), np.array(ys, dtype=np.float32),
                    np.arange(start, start + n))
            start += n
        w.close({"source": "test"})
    return out


@pytest.mark.parametrize("label", [0, 1])
def test_a_train_split_of_one_label_is_refused(tmp_path: Path, label: int) -> None:
    out = _data_dir(tmp_path / "d", {"train": [label] * 8, "val": [0, 1, 0], "test": [1, 0]})
    with pytest.raises(DataError, match=rf"every label of the train split is {label} \(8 rows\)") as err:
        open_data(str(out))
    assert err.value.path == str(out)


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_val_or_test_split_of_one_label_is_warned_about(tmp_path: Path, split: str) -> None:
    labels = {"train": [0, 1, 1, 0], "val": [0, 1, 0], "test": [1, 0]}
    labels[split] = [0] * 3
    out = _data_dir(tmp_path / "d", labels)
    with pytest.warns(UserWarning, match=rf"every label of the {split} split is 0 \(3 rows\): its AUC is undefined"):
        data = open_data(str(out))
    assert len(data.split("train")) == 4


def test_a_csv_of_all_zero_labels_is_refused_by_train_with_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    from rankitect.cli import main

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    path, _ = _csv(tmp_path, _rows(200, [0] * 200))
    code = main(["train", "--arch", "baseline:dlrm", f"data.source={path}", "train.steps=1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{path}: every label of the train split is 0" in err and not (tmp_path / "mlruns").exists()


class _Marker:
    """Unpickling this writes a file: the proof that unpickling ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


def test_a_pickled_array_in_a_data_directory_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    out = _data_dir(tmp_path / "d", {"train": [0, 1, 1, 0], "val": [0, 1, 0], "test": [1, 0]})
    marker = tmp_path / "ran"
    hostile = np.empty(4, dtype=object)
    hostile[:] = [_Marker(marker)] * 4
    np.save(out / "train" / "labels.npy", hostile, allow_pickle=True)
    assert pickle.loads(pickle.dumps(_Marker(tmp_path / "check"))) is None and (tmp_path / "check").exists()
    with pytest.raises(DataError, match="not a plain numeric .npy array") as err:
        open_data(str(out))
    assert err.value.path == str(out / "train" / "labels.npy")
    assert not marker.exists()
