"""Export of the recipe genes: per-field table widths with their projections, dropout and norms.

A model with every new gene is trained a few steps (so batch norm has running statistics), its
weights saved as a run keeps them, exported from those files, and scored in a process where
rankitect cannot be imported: the logits are the trained model's in eval mode.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rankitect.config import TrainConfig
from rankitect.export import export_from_files, generate_source
from rankitect.space.architecture import Architecture
from rankitect.space.testing import tiny_batch
from rankitect.track.weights import save_weights
from rankitect.train.loop import train_architecture
from tests.export.conftest import assert_same_logits, exported_model, perturbed_model
from tests.export.test_exporter import logits_outside_rankitect
from tests.search.tiny_data import tiny_click_data
from tests.space.test_recipe import full_arch, mixed_spec


@pytest.mark.parametrize("rocs", [False, True])
def test_exported_model_with_every_new_gene_equals_rankitect_model(rocs: bool, tmp_path: Path) -> None:
    spec, arch = mixed_spec(), full_arch(rocs=rocs)
    model = perturbed_model(arch, spec)
    with torch.no_grad():  # running statistics away from 0/1
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
    exported = exported_model(arch, spec, model, tmp_path)
    for batch_size in (1, 7):
        assert_same_logits(model, exported, tiny_batch(spec, batch_size, seed=batch_size))


def test_the_source_carries_table_widths_and_head_options() -> None:
    source = generate_source(full_arch(), mixed_spec())
    assert "dims=[12, 4, 8, 12, 4, 8]" in source  # field order: the request-side s5 first
    assert "projected={'small': [1, 4], 'large': [0, 3]}" in source or "'large': [0, 3]" in source
    assert "dropout=0.3, norm='layernorm'" in source


def test_a_genotype_without_recipe_exports_as_before() -> None:
    arch = dataclasses.replace(full_arch(), recipe=type(full_arch().recipe)())
    source = generate_source(arch, mixed_spec())
    assert "dims=" not in source and "projected=" not in source


def test_trained_model_exported_from_its_files_reproduces_its_logits_without_rankitect(tmp_path: Path) -> None:
    spec = mixed_spec()
    data = tiny_click_data(tmp_path / "data", rows=512, spec=spec)
    arch = full_arch()
    result = train_architecture(arch, data, TrainConfig(max_epochs=1, steps=12, batch_size=32, progress=False))
    model = result.model.eval()
    run = tmp_path / "run"
    run.mkdir()
    (run / "genotype.json").write_text(arch.to_json(indent=2))
    data.spec.save(run / "feature_spec.json")
    save_weights(model.state_dict(), run / "weights.safetensors")
    out = export_from_files(run / "genotype.json", run / "feature_spec.json", run / "weights.safetensors",
                            tmp_path / "export")
    assert Architecture.from_json((out / "genotype.json").read_text()) == arch
    batch = tiny_batch(data.spec, 9, seed=4)
    torch.save({"dense": batch.dense, "sparse_ids": batch.sparse_ids()}, out / "inputs.pt")
    (got,) = logits_outside_rankitect(tmp_path, out)
    with torch.no_grad():
        want = model(batch)
    assert got.shape == want.shape and (got - want).abs().max().item() <= 1e-6
