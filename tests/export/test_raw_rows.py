"""An exported model scores raw CSV rows on its own: ``model.py`` + ``model.safetensors`` +
``preprocess.json``, in a process that cannot import rankitect.

References: the tabular reader's ids for the same rows (its SipHash via pandas, its vocabulary),
and the rankitect model's probabilities on the cached rows.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rankitect.cli import main
from rankitect.data import open_data
from rankitect.space import Architecture, build_model
from tests.export.test_export_cli import _import

# a program that loads an export (argv[1]) without rankitect and reads raw CSV rows (argv[2]) into it
LOAD_ROWS = """
import csv, json, sys
sys.modules["rankitect"] = None  # the export must not need it
import importlib.util
spec = importlib.util.spec_from_file_location("exported", sys.argv[1] + "/model.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
scorer = module.load_scorer(sys.argv[1])
rows = list(csv.DictReader(open(sys.argv[2])))
dense, ids = scorer.features(rows)
"""
SCORE = LOAD_ROWS + """json.dump({"p": scorer(rows).tolist(), "ids": ids.tolist(), "dense": dense.tolist()}, open(sys.argv[3], "w"))
"""


def _write_csv(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    users = [f"u{int(i)}" for i in rng.zipf(1.5, n) % 50]
    items = rng.integers(0, 30, n)
    rows = {"rowno": np.arange(n), "price": np.round(rng.exponential(3.0, n), 2), "user": users, "item": items,
            "city": rng.choice(["Lyon", "Oslo", "Kyoto", ""], n)}
    logit = (rows["price"] > 3) * 1.0 + (items % 3 == 0) * 0.8 - 1.0
    rows["clicked"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    frame = pd.DataFrame(rows)
    frame.loc[rng.random(n) < 0.05, "price"] = np.nan  # missing dense -> 0
    frame.to_csv(path, index=False)


@pytest.mark.parametrize("vocab", ["train", "hash"])
def test_exported_model_scores_raw_csv_rows_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], vocab: str) -> None:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    data_csv, schema = tmp_path / "clicks.csv", tmp_path / "schema.yaml"
    _write_csv(data_csv, 6000, seed=1)
    schema.write_text(f"label: clicked\ndense: [rowno, price]\nsparse: [user, item, city]\nrequest: [user]\n"
                      f"vocab: {vocab}\nvocab_size: 40\nmin_count: 2\n")
    data_args = [f"data.source={data_csv}", f"data.schema={schema}", "train.batch_size=64", "runtime.threads=1", "search.workers=1"]
    assert main(["train", "--arch", "baseline:dlrm", "train.max_epochs=3", *data_args]) == 0
    run = capsys.readouterr().out.split("MLflow run: ")[1].split()[0]
    out = tmp_path / "exported"
    assert main(["export", run, "-o", str(out)]) == 0  # the run's own data settings: no data.* needed
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.py", "model.safetensors", "preprocess.json", "genotype.json", "feature_spec.json"])

    # raw rows: the file's test-split rows plus rows with values the data never had
    data = open_data(str(data_csv), schema=str(schema))
    test = data.split("test")
    # the reader's dense transform (sign(x) log1p|x|) undone: the file's row number of each cached row
    rowno = np.rint(np.expm1(test.take(np.arange(len(test))).dense[:, 0].double().numpy())).astype(int)
    raw = pd.read_csv(data_csv, dtype=str, keep_default_na=False)
    unseen = raw.iloc[:2].copy()
    unseen["user"], unseen["city"], unseen["item"] = ["never-seen", "nor-this"], ["Atlantis", "Mu"], ["999", "-5"]
    rows_csv = tmp_path / "rows.csv"
    pd.concat([raw.iloc[rowno], unseen]).to_csv(rows_csv, index=False)

    result = tmp_path / "scores.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", SCORE, str(out), str(rows_csv), str(result)], check=True, env=env,
                   cwd=tmp_path)
    got = json.loads(result.read_text())

    batch = test.take(np.arange(len(test)))
    n = len(test)
    assert torch.equal(torch.tensor(got["ids"][:n]), batch.sparse_ids())  # the reader's own ids
    assert torch.allclose(torch.tensor(got["dense"][:n]), batch.dense)
    files = out / "genotype.json"
    model = build_model(Architecture.from_json(files.read_text()), data.spec)
    model.load_state_dict(_exported_state(out, data.spec))
    with torch.no_grad():
        expected = torch.sigmoid(model.eval()(batch))
    assert torch.allclose(torch.tensor(got["p"][:n]), expected, atol=1e-6)
    # unseen values: the OOV id (vocabulary) or a bucket (hashing), never an error; a score each
    unseen_ids = got["ids"][n:]
    if vocab == "train":
        assert all(row[0] == 1 and row[2] == 1 for row in unseen_ids) and unseen_ids[0][1] == 1
    assert all(0 < p < 1 for p in got["p"][n:])


def _exported_state(out: Path, spec: object) -> dict[str, torch.Tensor]:
    """The exported tensors renamed back to the rankitect model's keys (the inverse of convert_state_dict)."""
    exported = _import(out / "model.py").read_safetensors(str(out / "model.safetensors"))
    names = {f"embedding.tables.{k}.weight": f"embedding.ebc.embedding_bags.t_{f.name}.weight"
             for k, f in enumerate(spec.sparse_in_field_order())}
    return {names.get(k, k): v for k, v in exported.items()}


def test_model_py_hash_is_pandas_hash() -> None:
    """The pure-Python SipHash-2-4 of model.py against pandas' C one (what the readers use)."""
    from rankitect.data.hashing import hash_strings
    from rankitect.export.bundled_runtime import hash_value

    values = ["", "a", "Lyon", "68fd1e64", "x" * 7, "y" * 8, "z" * 9, "ünïcødé", "long value " * 20]
    for salt in (1, 7, 26):
        expected = hash_strings(np.array(values, dtype=object), salt=salt).tolist()
        assert [hash_value(v, f"{salt:016d}") for v in values] == expected
