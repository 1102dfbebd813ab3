"""An exported history model scores raw CSV rows, history strings included, on its own: the reader's
ids (the shared column's vocabulary), right-aligned, and the rankitect model's logits."""

from __future__ import annotations

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
from tests.export.test_raw_rows import LOAD_ROWS

SCORE = LOAD_ROWS + """(hist, mask), = scorer.histories(rows)
logits = scorer.model(dense, ids, [(hist, mask)])
try:
    scorer([dict(rows[0], clicks="3|x")])
    bad = ""
except ValueError as e:
    bad = str(e)
json.dump({"logits": logits.tolist(), "ids": ids.tolist(), "hist": hist.tolist(), "mask": mask.tolist(),
           "bad": bad}, open(sys.argv[3], "w"))
"""


def write_history_csv(path: Path, n_sessions: int, seed: int) -> None:
    """Sessions of 1..6 candidate items; each session's history of earlier items (0..12 of them,
    longer than max_len sometimes); clicks more likely for an item in the history."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_sessions):
        history = [int(i) for i in rng.integers(1, 40, rng.integers(0, 13))]
        user = f"u{int(rng.integers(0, 30))}"
        for _ in range(int(rng.integers(1, 7))):
            item = int(rng.choice(history)) if history and rng.random() < 0.4 else int(rng.integers(1, 40))
            p = 0.6 if item in history[-8:] else 0.15
            rows.append({"session": s, "user": user, "item": item, "price": round(float(rng.exponential(3)), 2),
                         "clicks": "|".join(map(str, history)), "clicked": int(rng.random() < p)})
    pd.DataFrame(rows).to_csv(path, index=False)


SCHEMA = """label: clicked
dense: [price]
sparse: [user, item]
request: [user]
request_id: session
vocab: {vocab}
vocab_size: 60
history:
  - name: clicks
    max_len: 8
    shares: item
"""


def _exported_state(out: Path, spec) -> dict[str, torch.Tensor]:
    exported = _import(out / "model.py").read_safetensors(str(out / "model.safetensors"))
    names = {f"embedding.tables.{k}.weight": f"embedding.ebc.embedding_bags.t_{f.name}.weight"
             for k, f in enumerate(spec.sparse_in_field_order())}
    return {names.get(k, k): v for k, v in exported.items()}


@pytest.mark.parametrize(("vocab", "arch"), [("train", "baseline:din"), ("hash", "baseline:bst")])
def test_an_exported_history_model_scores_raw_rows_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], vocab: str, arch: str,
) -> None:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    data_csv, schema = tmp_path / "clicks.csv", tmp_path / "schema.yaml"
    write_history_csv(data_csv, 500, seed=2)
    schema.write_text(SCHEMA.format(vocab=vocab))
    data_args = [f"data.source={data_csv}", f"data.schema={schema}", "train.batch_size=64", "runtime.threads=1"]
    assert main(["train", "--arch", arch, "train.max_epochs=1", *data_args]) == 0
    run = capsys.readouterr().out.split("MLflow run: ")[1].split()[0]
    out = tmp_path / "exported"
    assert main(["export", run, "-o", str(out)]) == 0

    check_raw_row_scores(out, data_csv, schema, tmp_path)


def check_raw_row_scores(out: Path, data_csv: Path, schema: Path, tmp_path: Path) -> None:
    """The export in ``out`` scores the raw CSV rows of the test split in a process without rankitect:
    the reader's ids and histories, and the rankitect model's logits."""
    data = open_data(str(data_csv), schema=str(schema))
    test = data.split("test")
    batch = test.take(np.arange(len(test)))
    raw = pd.read_csv(data_csv, dtype=str, keep_default_na=False)
    # the file rows of the cached test rows: sessions are sorted and rows kept in file order
    sessions = raw["session"].astype(int).to_numpy()
    stored = np.concatenate([np.asarray(data.split(s).request_ids) for s in ("train", "val", "test")])
    offset = len(data.split("train")) + len(data.split("val"))
    rid_rows = {}
    for k, q in enumerate(stored):
        rid_rows.setdefault(int(q), []).append(k)
    file_of = {}
    for q, ks in rid_rows.items():
        for j, k in enumerate(ks):
            file_of[k] = int(np.flatnonzero(sessions == pd.unique(sessions)[q])[j])
    rows_csv = tmp_path / "rows.csv"
    raw.iloc[[file_of[offset + i] for i in range(len(test))]].drop(columns="session").to_csv(rows_csv, index=False)

    result = tmp_path / "scores.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", SCORE, str(out), str(rows_csv), str(result)], check=True, env=env,
                   cwd=tmp_path)
    got = json.loads(result.read_text())
    assert torch.equal(torch.tensor(got["ids"]), batch.sparse_ids())  # the reader's ids
    ids, mask = batch.history_padded("clicks", 8)
    assert torch.equal(torch.tensor(got["hist"]), ids) and torch.equal(torch.tensor(got["mask"]), mask)
    assert "row 0: history column 'clicks': 'x' is not an integer id" in got["bad"]
    model = build_model(Architecture.from_json((out / "genotype.json").read_text()), data.spec)
    model.load_state_dict(_exported_state(out, data.spec))
    with torch.no_grad():
        expected = model.eval()(batch)
    assert torch.allclose(torch.tensor(got["logits"]), expected, atol=1e-5)
