"""The exported scorer refuses rows it would otherwise score wrongly without a word: a misspelled
column, an absent one, an empty row; ``allow_missing=True`` is the explicit way to score absent
columns as missing values. And every file of an export has the mode a new file gets."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from rankitect.data import open_data
from rankitect.data.spec import FeatureSpec
from rankitect.export import export_model
from rankitect.export.exporter import FILES
from rankitect.space import Architecture, build_model
from rankitect.space.baselines import get_baseline
from tests.export.conftest import import_file
from tests.export.test_raw_rows import _write_csv


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A DLRM (untrained weights) exported with the preprocessing of a small CSV, and raw rows of it."""
    root = tmp_path_factory.mktemp("row-check")
    data_csv, schema = root / "clicks.csv", root / "schema.yaml"
    _write_csv(data_csv, 600, seed=3)
    schema.write_text("label: clicked\ndense: [rowno, price]\nsparse: [user, item, city]\nrequest: [user]\n"
                      "vocab: hash\nvocab_size: 40\n")
    old = os.environ.get("RANKITECT_DATA_DIR")
    os.environ["RANKITECT_DATA_DIR"] = str(root / "cache")
    try:
        data = open_data(str(data_csv), schema=str(schema))
    finally:
        os.environ.pop("RANKITECT_DATA_DIR") if old is None else os.environ.update(RANKITECT_DATA_DIR=old)
    torch.manual_seed(0)
    arch = get_baseline("dlrm", data.spec)
    out = export_model(build_model(arch, data.spec), arch, data.spec, root / "export", data=data)
    rows = pd.read_csv(data_csv, dtype=str, keep_default_na=False).head(4).to_dict(orient="records")
    return out, rows


def test_a_misspelled_column_is_refused_by_name(exported: tuple[Path, list[dict]]) -> None:
    out, rows = exported
    scorer = import_file(out / "model.py").load_scorer(str(out))
    typo = [dict(rows[0]), {("citty" if k == "city" else k): v for k, v in rows[1].items()}]
    with pytest.raises(ValueError, match=r"row 1: unknown column 'citty'"):
        scorer(typo)
    with pytest.raises(ValueError, match=r"row 1: unknown column 'citty'"):
        scorer(typo, allow_missing=True)  # the opt-in is for absent columns, never for unknown ones


def test_an_empty_or_short_row_is_refused_unless_missing_values_are_allowed(exported: tuple[Path, list[dict]]) -> None:
    out, rows = exported
    scorer = import_file(out / "model.py").load_scorer(str(out))
    with pytest.raises(ValueError, match=r"row 0: no column 'rowno' \(and 4 more\).*allow_missing=True"):
        scorer([{}])
    short = {k: v for k, v in rows[2].items() if k != "city"}
    with pytest.raises(ValueError, match=r"row 0: no column 'city'"):
        scorer([short])
    # opted in: an absent column scores as the empty field of a CSV row (the readers' missing value)
    blank = dict(rows[2], city="")
    assert torch.equal(scorer([short], allow_missing=True), scorer([blank]))
    nothing = {k: "" for k in rows[0] if k != "clicked"}
    assert torch.equal(scorer([{}], allow_missing=True), scorer([nothing]))
    assert torch.equal(scorer(rows), scorer([{k: v for k, v in r.items() if k != "clicked"} for r in rows]))


def test_every_exported_file_has_the_mode_of_a_new_file(exported: tuple[Path, list[dict]]) -> None:
    out, _ = exported
    umask = os.umask(0)
    os.umask(umask)
    modes = {name: (out / name).stat().st_mode & 0o777 for name in FILES}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    # exporting again over an older export whose weights were 0600 gives them the same mode again
    (out / "model.safetensors").chmod(0o600)
    arch = Architecture.from_json((out / "genotype.json").read_text())
    spec = FeatureSpec.load(out / "feature_spec.json")
    export_model(build_model(arch, spec), arch, spec, out)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
