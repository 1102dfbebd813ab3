"""Export directories: files, weights renaming, loading in a process without rankitect, torch.export."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rankitect.data.spec import FeatureSpec
from rankitect.errors import DataError
from rankitect.export import convert_state_dict, export_from_files, export_model, read_state_dict
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.testing import tiny_batch, tiny_spec
from tests.export.archs import ALL_OPS, DENSE_ONLY, SMALL_ENGINEER, SMALL_NASREC, sampled
from tests.export.conftest import assert_same_logits, import_file, perturbed_model

# Runs in a separate interpreter: -I -S (no site-packages .pth files, hence no editable rankitect),
# torch's own directory added by hand; proves rankitect cannot be imported there. One torch thread,
# as the tests' reference logits (tests/conftest.py): a matmul's sums are split by thread count, so
# the same model at two thread counts differs in the last float bits.
CHECK_SCRIPT = """
import importlib.util, sys
sys.path.append(sys.argv[1])
try:
    import rankitect
except ImportError:
    pass
else:
    raise SystemExit("rankitect is importable")
import torch
torch.set_num_threads(1)
for i, d in enumerate(sys.argv[2:]):
    spec = importlib.util.spec_from_file_location(f"exported_{i}", d + "/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.load(d)
    inputs = torch.load(d + "/inputs.pt", weights_only=True)
    with torch.no_grad():
        torch.save(model(inputs["dense"], inputs["sparse_ids"]), d + "/logits.pt")
assert not any(m.split(".")[0] == "rankitect" for m in sys.modules)
"""


def logits_outside_rankitect(tmp_path: Path, *dirs: str | Path) -> list[torch.Tensor]:
    """Each export folder's ``model.py`` run by :data:`CHECK_SCRIPT` on its ``inputs.pt`` in an
    interpreter where rankitect cannot be imported (the script checks that); the logits it wrote."""
    (tmp_path / "check.py").write_text(CHECK_SCRIPT)
    torch_dir = str(Path(torch.__file__).resolve().parent.parent)
    run = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "check.py"), torch_dir, *map(str, dirs)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return [torch.load(Path(d) / "logits.pt", weights_only=True) for d in dirs]


def test_convert_state_dict_names_tables_by_field_position() -> None:
    spec = tiny_spec()
    model = perturbed_model(ALL_OPS, spec)
    state = model.state_dict()
    converted = convert_state_dict(state, spec)
    field_order = [f.name for f in spec.sparse if f.side == "request"] + [
        f.name for f in spec.sparse if f.side == "candidate"
    ]
    for k, name in enumerate(field_order):
        assert torch.equal(converted[f"embedding.tables.{k}.weight"], model.embedding.table(name))
    rest = {key for key in state if not key.startswith("embedding.")}
    assert set(converted) == rest | {f"embedding.tables.{k}.weight" for k in range(spec.n_sparse)}
    assert all(torch.equal(converted[key], state[key]) for key in rest)
    with pytest.raises(ValueError, match="t_nope"):
        convert_state_dict({"embedding.ebc.embedding_bags.t_nope.weight": torch.zeros(2, 2)}, spec)


def test_export_writes_every_file(tmp_path: Path) -> None:
    spec = tiny_spec()
    arch = dataclasses.replace(ALL_OPS, rocs=True)
    model = perturbed_model(arch, spec)
    out = export_model(model, arch, spec, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.py", "model.safetensors", "genotype.json", "feature_spec.json"]
    )  # one weights file; preprocess.json only when the data set is given
    safetensors = load_file(str(out / "model.safetensors"))
    assert safetensors.keys() == convert_state_dict(model.state_dict(), spec).keys()
    # model.py's own reader (no safetensors package) gives the same tensors as the package
    read = import_file(out / "model.py").read_safetensors(str(out / "model.safetensors"))
    assert read.keys() == safetensors.keys() and all(torch.equal(read[k], safetensors[k]) for k in read)
    assert Architecture.from_json((out / "genotype.json").read_text()) == arch
    assert FeatureSpec.load(out / "feature_spec.json") == spec
    loaded = import_file(out / "model.py").load(str(out))
    assert_same_logits(model, loaded, tiny_batch(spec, 5))
    with pytest.raises(ValueError, match="architecture"):
        export_model(model, ALL_OPS, spec, tmp_path / "other")


def test_export_loads_and_scores_in_a_process_without_rankitect(tmp_path: Path) -> None:
    spec = tiny_spec().with_dense_stats([12.0, -3.0, 0.5, 100.0], [0.6, 2.0, 1.0, 40.0])  # standardized inside
    nasrec, engineer = sampled("nasrec", SMALL_NASREC, 1, 3)[0], sampled("engineer", SMALL_ENGINEER, 1, 4)[0]
    archs = [dataclasses.replace(ALL_OPS, rocs=True), nasrec, dataclasses.replace(engineer, rocs=True), DENSE_ONLY]
    batch = tiny_batch(spec, 6, seed=5)
    dirs, expected = [], []
    for i, arch in enumerate(archs):
        model = perturbed_model(arch, spec, seed=i)
        out = export_model(model, arch, spec, tmp_path / f"m{i}")
        torch.save({"dense": batch.dense, "sparse_ids": batch.sparse_ids()}, out / "inputs.pt")
        with torch.no_grad():
            expected.append(model(batch))
        dirs.append(str(out))
    for got, want in zip(logits_outside_rankitect(tmp_path, *dirs), expected):
        assert got.shape == want.shape and (got - want).abs().max().item() <= 1e-6


# The blocks with the most shape handling (dot, every DHEN module, Wukong, attention), masked.
EXPORT_ARCH = Architecture(
    (
        BlockGene("mlp", ("dense",), {"width": 8}),
        BlockGene("dot", ("sparse", 0)),
        BlockGene("dhen", (1, "sparse"), {"modules": ["dot", "attention", "linear", "dcn", "fm"], "out_fields": 3}),
        BlockGene("wukong", (2,), {"fmb_fields": 2, "lcb_fields": 2, "low_rank": 2, "mlp_width": 4}),
        BlockGene("attention", (3,), {"num_heads": 2}),
    ),
    HeadGene((4, 0), (16,)),
    embedding_dim=4,
    rocs=True,
)


def test_torch_export_with_a_dynamic_batch(tmp_path: Path) -> None:
    spec = tiny_spec()
    arch = EXPORT_ARCH
    model = perturbed_model(arch, spec)
    out = export_model(model, arch, spec, tmp_path)
    exported = import_file(out / "model.py").load(str(out))
    batch = tiny_batch(spec, 4)
    dim = torch.export.Dim("batch", min=2)
    program = torch.export.export(
        exported, (batch.dense, batch.sparse_ids()), dynamic_shapes={"dense": {0: dim}, "sparse_ids": {0: dim}}
    )
    other = tiny_batch(spec, 7, seed=2)
    with torch.no_grad():
        got, want = program.module()(other.dense, other.sparse_ids()), model(other)
    assert (got - want).abs().max().item() <= 1e-6


def test_export_from_files_reads_plain_lightning_and_safetensors_weights(tmp_path: Path) -> None:
    spec = tiny_spec()
    arch = ALL_OPS
    model = perturbed_model(arch, spec)
    (tmp_path / "genotype.json").write_text(arch.to_json())
    spec.save(tmp_path / "spec.json")
    state = model.state_dict()
    torch.save(state, tmp_path / "plain.pt")
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}, "epoch": 3}, tmp_path / "task.ckpt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    batch = tiny_batch(spec, 5)
    for name in ("plain.pt", "task.ckpt", "w.safetensors"):
        out = export_from_files(tmp_path / "genotype.json", tmp_path / "spec.json", tmp_path / name, tmp_path / name[:4])
        assert_same_logits(model, import_file(out / "model.py").load(str(out)), batch)


def test_export_from_files_names_the_bad_file(tmp_path: Path) -> None:
    spec = tiny_spec()
    (tmp_path / "genotype.json").write_text(DENSE_ONLY.to_json())
    spec.save(tmp_path / "spec.json")
    torch.save(perturbed_model(ALL_OPS, spec).state_dict(), tmp_path / "other.pt")
    with pytest.raises(DataError, match="other.pt"):
        export_from_files(tmp_path / "genotype.json", tmp_path / "spec.json", tmp_path / "other.pt", tmp_path / "o")
    (tmp_path / "bad.json").write_text(json.dumps({"blocks": [{"op": "nope", "inputs": ["dense"]}]}))
    with pytest.raises(DataError, match="bad.json"):
        export_from_files(tmp_path / "bad.json", tmp_path / "spec.json", tmp_path / "other.pt", tmp_path / "o")


def test_unreadable_weights_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    for name in ("junk.pt", "junk.safetensors"):
        with pytest.raises(DataError, match=name):
            read_state_dict(tmp_path / name)
