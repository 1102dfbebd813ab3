"""Write a model as a standalone directory: ``model.py`` (PyTorch only), weights, preprocessing.

The directory holds

* ``model.py``: the source of :func:`~rankitect.export.codegen.generate_source`, with
  ``load(directory) -> ExportedModel`` and ``load_scorer(directory)`` (raw rows in, probabilities out);
* ``model.safetensors``: the one weights file, which ``model.py`` reads without the safetensors
  package (so it needs nothing but torch);
* ``preprocess.json``: how a raw row becomes the model's inputs (vocabularies or hashing, dense
  transforms; :mod:`rankitect.export.preprocess`), when the data set is given;
* ``genotype.json`` and ``feature_spec.json``: the architecture and the data it expects.

``rankitect export RUN_ID -o DIR`` is one call to :func:`export_from_files`.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from rankitect.data.spec import FeatureSpec
from rankitect.errors import DataError
from rankitect.data.clickdata import ClickData
from rankitect.export.codegen import generate_source
from rankitect.export.preprocess import preprocessing
from rankitect.space.architecture import Architecture, read_genotype
from rankitect.space.builder import RankingModel, build_model
from rankitect.space.pricing import check_fits

EMBEDDING_PREFIX = "embedding.ebc.embedding_bags."
# What a damaged or foreign weights file raises from torch.load / safetensors.
READ_ERRORS = (OSError, RuntimeError, ValueError, EOFError, IndexError, pickle.UnpicklingError, SafetensorError)
FILES = ("model.py", "model.safetensors", "preprocess.json", "genotype.json", "feature_spec.json")


def convert_state_dict(model_state: Mapping[str, torch.Tensor], spec: FeatureSpec) -> dict[str, torch.Tensor]:
    """A :class:`RankingModel` state dict renamed for the exported model.

    Only the embedding tables change name: torchrec's ``embedding.ebc.embedding_bags.t_<feature>.weight``
    becomes ``embedding.tables.<k>.weight`` with ``k`` the feature's field position (request side
    first), and a history's own ``history.tables.<name>.weight`` becomes ``history_tables.<k>.weight``
    with ``k`` its position among the sequence features; every other key is the same in both models.
    Tensors are detached, contiguous CPU copies.

    >>> from rankitect.space.testing import tiny_spec
    >>> state = {"embedding.ebc.embedding_bags.t_s5.weight": torch.zeros(17, 2), "head.mlp.0.bias": torch.zeros(1)}
    >>> sorted(convert_state_dict(state, tiny_spec()))
    ['embedding.tables.0.weight', 'head.mlp.0.bias']
    """
    fields = {f"t_{f.name}.weight": k for k, f in enumerate(spec.sparse_in_field_order())}
    histories = {f"history.tables.{f.name}.weight": f"history_tables.{k}.weight" for k, f in enumerate(spec.sequence)}
    out: dict[str, torch.Tensor] = {}
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"state dict entry {key!r} is not a tensor: {type(value).__name__}")
        if key.startswith("history.tables."):  # a history's own table: named by its position, as features are
            if key not in histories:
                raise ValueError(f"state dict key {key!r} matches no sequence feature of the spec")
            key = histories[key]
        elif key.startswith(EMBEDDING_PREFIX):
            table = key[len(EMBEDDING_PREFIX) :]
            if table not in fields:
                raise ValueError(f"state dict key {key!r} matches no sparse feature of the spec")
            key = f"embedding.tables.{fields[table]}.weight"
        out[key] = value.detach().to("cpu").contiguous().clone()
    return out


def export_model(
    model: RankingModel, arch: Architecture, spec: FeatureSpec, out_dir: str | Path, *, data: ClickData | None = None
) -> Path:
    """Write ``model`` (built from ``arch`` and ``spec``) as a standalone directory; returns it.

    The files are listed in the module docstring (``preprocess.json`` only with ``data``, the data
    set the model was trained on); an existing directory is written into (files of the same names
    are replaced, a ``weights.pt`` of an older export removed).
    """
    if not isinstance(model, RankingModel):
        raise ValueError(f"expected a RankingModel, got {type(model).__name__}")
    if model.arch != arch:
        raise ValueError(f"the model was built from architecture {model.arch.hash}, not {arch.hash}")
    if model.spec != spec:
        raise ValueError("the model was built for another feature spec than the one given")
    out = output_dir(out_dir)
    source = generate_source(arch, spec)
    state = convert_state_dict(model.state_dict(), spec)
    (out / "model.py").write_text(source)
    (out / "weights.pt").unlink(missing_ok=True)
    # As bytes through a plain write: safetensors' own save_file creates its file mode 0600, and
    # every file of an export should share one mode, the one the umask gives new files.
    # (a new file, not one an older export made 0600 and a write would keep so)
    (out / "model.safetensors").unlink(missing_ok=True)
    (out / "model.safetensors").write_bytes(save(state, metadata={"architecture": arch.hash}))
    if data is not None:
        # the reader's preprocessing must be the model's; the dense statistics are the model's own
        if data.spec.with_dense_stats_of(spec) != spec:
            raise ValueError("the data set's feature spec differs from the model's")
        (out / "preprocess.json").write_text(json.dumps(preprocessing(data)) + "\n")
    (out / "genotype.json").write_text(arch.to_json(indent=2) + "\n")
    spec.save(out / "feature_spec.json")
    return out


def output_dir(out_dir: str | Path) -> Path:
    """``out_dir``, created if new; a :class:`DataError` naming it when it is a file or cannot be made."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError("the export target exists and is not a directory", path=str(out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create the export directory: {err.strerror or type(err).__name__}",
                        path=str(out)) from None
    if not os.access(out, os.W_OK):
        raise DataError("the export directory is not writable", path=str(out))
    return out


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A :class:`RankingModel` state dict from ``.safetensors``, or a ``torch.save`` file read with ``weights_only``.

    A checkpoint holding ``{"state_dict": ...}`` (as Lightning writes) is unwrapped, and the
    ``model.`` prefix of the training task's keys is removed.
    """
    p = Path(path)
    try:
        if p.suffix == ".safetensors":
            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
    except READ_ERRORS as err:
        raise DataError(f"cannot read weights: {err}", path=str(p)) from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise DataError("expected a state dict (a mapping of names to tensors)", path=str(p))
    if state and all(k.startswith("model.") for k in state):
        state = {k[len("model.") :]: v for k, v in state.items()}
    return dict(state)


def export_from_files(
    genotype_json_path: str | Path, spec_json_path: str | Path, state_dict_path: str | Path, out_dir: str | Path,
    *, data: ClickData | None = None,
) -> Path:
    """Rebuild a model from its genotype, feature spec and weights files, and export it to ``out_dir``
    (with ``data``, its feature preprocessing too)."""
    arch = read_genotype(genotype_json_path)  # within the size and depth limits; DataError naming the file
    try:
        spec = FeatureSpec.load(spec_json_path)
    except (OSError, ValueError, TypeError, json.JSONDecodeError) as err:
        raise DataError(f"not a feature spec: {err}", path=str(spec_json_path)) from None
    try:
        check_fits(arch, spec, None, None, where=f"{genotype_json_path}: ")  # its weights fit, before they are made
        model = build_model(arch, spec)
    except ValueError as err:
        raise DataError(f"the genotype does not fit the feature spec: {err}", path=str(genotype_json_path)) from None
    try:
        model.load_state_dict(read_state_dict(state_dict_path))
    except RuntimeError as err:
        raise DataError(f"weights do not fit the genotype: {err}", path=str(state_dict_path)) from None
    return export_model(model, arch, spec, out_dir, data=data)


__all__ = ["FILES", "convert_state_dict", "export_from_files", "export_model", "read_state_dict"]
