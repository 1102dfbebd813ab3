"""A user's registered block (``tests/export/toy_block.py``) is searched, exported and scored without rankitect.

The block's file is all the user writes: registering it is enough for the space, the search, the
tracked weights and the exporter, which bundles its source into ``model.py`` like the blocks of
rankitect.
"""

from __future__ import annotations

import doctest
import importlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from rankitect.blocks import BLOCKS
from rankitect.cli import main
from rankitect.data import open_data
from rankitect.export import read_state_dict
from rankitect.space import Architecture, build_model
from rankitect.space.architecture import BlockGene, HeadGene
from rankitect.space.space import SPACES, Choice, SearchSpace, register_space
from tests.export.test_exporter import logits_outside_rankitect
from tests.learnable import learnable_source

MODULE = "tests.export.toy_block"


class ToySpace(SearchSpace):
    """The user's block on the sparse fields, then an MLP with the dense features: two choices."""

    def __init__(self, *, use_dense: bool = True, rocs: bool = False) -> None:
        super().__init__("toy", [Choice("reduction", (1, 2)), Choice("width", (8, 16))],
                         {"use_dense": use_dense, "rocs": rocs})
        self.inputs = (0, "dense") if use_dense else (0,)

    def _decode(self, sample: Mapping[str, Any]) -> Architecture:
        return Architecture(
            (BlockGene("field_gate", ("sparse",), {"reduction": sample["reduction"]}),
             BlockGene("mlp", self.inputs, {"width": sample["width"]})),
            HeadGene((1,), ()), embedding_dim=4,
        )

    def _encode(self, arch: Architecture) -> dict[str, Any] | None:
        return {"reduction": arch.blocks[0].params["reduction"], "width": arch.blocks[1].params["width"]}


@pytest.fixture()
def toy(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The toy block registered (and its space), a fresh MLflow store; both registrations undone after."""
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path_factory.getbasetemp() / "user-block-data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(MODULE)
    register_space("toy")(ToySpace)
    try:
        yield module
    finally:
        BLOCKS.pop("field_gate", None)
        SPACES.pop("toy", None)
        sys.modules.pop(MODULE, None)


def test_the_user_block_runs_its_own_example(toy: ModuleType) -> None:
    result = doctest.testmod(toy)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])  # 2: worker processes import the block's module themselves
def test_a_user_block_is_searched_exported_and_scored_without_rankitect(
    toy: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    source = learnable_source()
    tiny = [f"data.source={source}", "train.batch_size=64", "train.test_batches=0", "train.val_batches=2",
            "train.progress=false", "runtime.threads=1"]
    assert main(["search", "--strategy", "random", "--trials", "2", "train.max_epochs=1", "search.space=toy",
                 "search.flops_range=null", "search.baselines=[]", "search.pruning=none", f"search.workers={workers}",
                 *tiny]) == 0
    out_text = capsys.readouterr().out
    parent = out_text.split("MLflow search run: ")[1].split()[0]
    assert "FAILED" not in out_text  # every trial built the user's block, in this process or a worker
    out = tmp_path / "exported"
    assert main(["export", parent, "-o", str(out), *tiny]) == 0
    arch = Architecture.from_json((out / "genotype.json").read_text())
    assert arch.blocks[0].op == "field_gate"
    assert "class FieldGate(Block):" in (out / "model.py").read_text()

    # The tracked winner in this process, from the weights rankitect wrote (safetensors).
    from rankitect.track import Tracker

    files = Tracker().fetch_model_files(parent, tmp_path / "fetched")
    data = open_data(source)
    model = build_model(arch, data.spec)
    model.load_state_dict(read_state_dict(files.weights))
    batch = next(data.split("test").batches(32, shuffle=False))
    torch.save({"dense": batch.dense, "sparse_ids": batch.sparse_ids()}, out / "inputs.pt")

    (got,) = logits_outside_rankitect(tmp_path, out)  # model.py where rankitect cannot be imported
    with torch.no_grad():
        expected = model.eval()(batch)
    assert got.shape == expected.shape == (32,)
    assert (got - expected).abs().max().item() <= 1e-6
    assert expected.std().item() > 0  # the logits depend on the rows: the comparison says something
