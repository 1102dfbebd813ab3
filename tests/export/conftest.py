"""Shared helpers: import a generated ``model.py``, build a rankitect model with non-default weights."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import torch

from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.export import convert_state_dict, generate_source
from rankitect.space.architecture import Architecture
from rankitect.space.builder import RankingModel, build_model

# Importing the user's block registers it; test_user_block.py does that itself and undoes it after,
# so that registry-wide tests elsewhere see only rankitect's blocks (hence no doctest collection here).
collect_ignore = ["toy_block.py"]

_COUNTER = itertools.count()


def import_file(path: Path) -> ModuleType:
    """Import ``path`` as a fresh module (a new name each time, so nothing is cached between tests)."""
    spec = importlib.util.spec_from_file_location(f"exported_model_{next(_COUNTER)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_source(source: str, directory: Path) -> ModuleType:
    path = directory / f"model_{next(_COUNTER)}.py"
    path.write_text(source)
    return import_file(path)


def perturbed_model(arch: Architecture, spec: FeatureSpec, seed: int = 0) -> RankingModel:
    """A rankitect model whose every parameter is moved off its init (LayerNorm affines included)."""
    torch.manual_seed(seed)
    model = build_model(arch, spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def exported_model(arch: Architecture, spec: FeatureSpec, model: RankingModel, directory: Path) -> torch.nn.Module:
    """The generated ``ExportedModel`` of ``arch`` holding ``model``'s weights (loaded strictly)."""
    module = import_source(generate_source(arch, spec), directory)
    exported = module.ExportedModel()
    exported.load_state_dict(convert_state_dict(model.state_dict(), spec))
    return exported.eval()


def assert_same_logits(model: RankingModel, exported: torch.nn.Module, batch: Batch) -> None:
    with torch.no_grad():
        expected = model(batch)
        if model.history is None:
            got = exported(batch.dense, batch.sparse_ids())
        else:  # one (ids, mask) pair per sequence feature of the spec
            history = [batch.history_padded(f.name, f.max_len) for f in model.spec.sequence]
            got = exported(batch.dense, batch.sparse_ids(), history)
    assert got.shape == expected.shape == (len(batch),)
    assert (got - expected).abs().max().item() <= 1e-6
