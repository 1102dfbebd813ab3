"""A genotype is priced before it is built: parameters and activations from meta builds, deep
blocks extrapolated exactly, giants refused naming their gene, genotype JSON read within limits."""

from __future__ import annotations

import json
import re
import resource
from pathlib import Path

import pytest

from rankitect.errors import DataError
from rankitect.space.architecture import MAX_JSON_DEPTH, Architecture, BlockGene, HeadGene, read_genotype
from rankitect.space.baselines import BASELINES, get_baseline
from rankitect.space.builder import build_model
from rankitect.space import pricing
from rankitect.space.pricing import OverBudget, check_fits, price
from rankitect.space.testing import tiny_spec


def _mlp(**params: int) -> Architecture:
    return Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8, **params}),), embedding_dim=4)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_params_are_the_built_models_own(name: str) -> None:
    spec = tiny_spec()
    arch = get_baseline(name, spec)
    model = build_model(arch, spec)
    priced = price(arch, spec)
    assert priced.params == sum(p.numel() for p in model.parameters())
    assert priced.part("embedding_dim").params == sum(p.numel() for p in model.sparse_parameters())
    held = [*model.parameters(), *model.buffers()]
    assert priced.bytes(None) == sum(t.numel() * t.element_size() for t in held)


@pytest.mark.parametrize("layers", [1, 3, 7])
def test_activation_of_a_plain_mlp_is_the_textbook_count(layers: int) -> None:
    # Linear saves its input, ReLU its output, and the next Linear's input is that same output:
    # in + layers * width floats per row (no norm, so nothing else is saved).
    priced = price(_mlp(num_layers=layers, norm="none"), tiny_spec())
    assert priced.part("blocks[0]").activation == 4 * (4 + layers * 8)


@pytest.mark.parametrize(("op", "source", "depth", "params"), [
    ("mlp", "dense", "num_layers", {"width": 8}),
    ("mlp", "dense", "num_layers", {"width": 8, "norm": "none", "activation": "gelu"}),
    ("dcn", "dense", "num_layers", {"low_rank": 2}),
    ("wukong", "sparse", "mlp_layers", {}),
])
def test_deep_blocks_are_extrapolated_to_what_building_them_gives(
    monkeypatch: pytest.MonkeyPatch, op: str, source: str, depth: str, params: dict,
) -> None:
    spec = tiny_spec()
    arch = Architecture(blocks=(BlockGene(op, (source,), {depth: 11, **params}),), embedding_dim=4)
    extrapolated = price(arch, spec)
    monkeypatch.setattr(pricing, "DEPTH_CAP", 100)  # now built at depth 11
    built = price(arch, spec)
    assert extrapolated == built
    model = build_model(arch, spec, device="meta")
    assert extrapolated.params == sum(p.numel() for p in model.parameters())


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def test_a_million_layers_are_refused_before_any_allocation() -> None:
    spec = tiny_spec()
    check_fits(_mlp(num_layers=3), spec, None, 512)  # warm up imports and the meta build path
    before = _max_rss_mb()
    with pytest.raises(OverBudget) as err:
        check_fits(_mlp(num_layers=1_000_000), spec, 8.0, 512, where="deep.json: ")
    assert _max_rss_mb() - before < 50  # the million layers were never built
    message = str(err.value)
    assert message.startswith("deep.json: blocks[0].params.num_layers=1000000: ")
    assert "> runtime.memory_budget (8.00 GB)" in message
    # 10^6 layers of 8x8 weights, 8 biases, LayerNorm's 16: the count a full build would give
    assert f"{(4 * 8 + 8 + 16) + 999_999 * (8 * 8 + 8 + 16) + 9 + 0:,} params" in message


@pytest.mark.parametrize(("arch", "gene"), [
    (_mlp(width=10**9), "blocks[0].params.width=1000000000"),
    (Architecture(blocks=(BlockGene("dot", ("sparse",)),), embedding_dim=10**7), "embedding_dim=10000000"),
    (Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8}),), head=HeadGene(widths=(10**6, 10**6)),
                  embedding_dim=4), "head.widths[0]=1000000"),
    (Architecture(blocks=(BlockGene("wukong", ("sparse",), {"mlp_width": 10**7}),), embedding_dim=4),
     "blocks[0].params.mlp_width=10000000"),
])
def test_giants_are_refused_naming_their_gene(arch: Architecture, gene: str) -> None:
    before = _max_rss_mb()
    with pytest.raises(OverBudget, match=f"^{re.escape(gene)}: the model needs"):
        check_fits(arch, tiny_spec(), 8.0, 512)
    assert _max_rss_mb() - before < 50


def test_training_adds_gradients_optimizer_state_and_a_batch_of_activations() -> None:
    spec = tiny_spec()
    arch = get_baseline("dlrm", spec)
    priced = check_fits(arch, spec, 1.0, 512)
    assert priced.bytes(512) == priced.bytes(None) + 512 * priced.activation + 4 * (
        3 * (priced.params - priced.part("embedding_dim").params) + priced.part("embedding_dim").rows)
    with pytest.raises(OverBudget, match="or train.batch_size"):
        check_fits(arch, spec, priced.bytes(512) / 1e9 * 0.99, 512)


def test_sizes_no_tensor_can_have_are_refused_before_torch_sees_them() -> None:
    with pytest.raises(ValueError, match=r"blocks\[0\].params.width=10000000000000000000: above"):
        price(_mlp(width=10**19), tiny_spec())


def test_genotype_json_is_read_within_size_and_depth(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(_mlp().to_json())
    assert read_genotype(good) == _mlp()
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=rf"^{re.escape(str(deep))}: not a valid genotype: JSON nested deeper than {MAX_JSON_DEPTH}"):
        read_genotype(deep)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blocks": [], "pad": "x" * 300_000}))
    with pytest.raises(DataError, match=rf"^{re.escape(str(big))}: not a valid genotype: more than a genotype's limit"):
        read_genotype(big)
    # brackets inside strings are not nesting
    inside = tmp_path / "inside.json"
    inside.write_text(json.dumps({**_mlp().to_dict(), "rocs": "[" * 100}))
    with pytest.raises(DataError, match="rocs: must be a bool"):
        read_genotype(inside)


def test_train_refuses_a_million_layer_file_with_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    from rankitect.cli import main

    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    monkeypatch.chdir(tmp_path)
    genotype = tmp_path / "deep.json"
    genotype.write_text(_mlp(num_layers=1_000_000).to_json())
    code = main(["train", "--arch", str(genotype), "data.rows=400", "runtime.memory_budget=4"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{genotype}: blocks[0].params.num_layers=1000000: the model needs about" in err
    assert "Traceback" not in err and not (tmp_path / "mlruns").exists()


def test_a_candidate_above_the_budget_fails_its_trial_only(tmp_path: Path) -> None:
    from rankitect.config import TrainConfig
    from rankitect.search.running.trial import run_trial

    class Data:  # run_trial prices before it touches the data beyond its spec
        spec = tiny_spec()

    out = run_trial(_mlp(num_layers=1_000_000), Data(), TrainConfig(batch_size=512), memory_budget=1.0)
    assert out.result.status == "failed" and "blocks[0].params.num_layers=1000000" in out.result.error


def test_a_block_whose_training_forward_reads_values_is_priced_too() -> None:
    # buckets learns its edges from the first training batch's values, which meta tensors lack
    arch = Architecture(blocks=(BlockGene("buckets", ("dense",), {"dim": 4}), BlockGene("fm", (0,))),
                        embedding_dim=4)
    priced = price(arch, tiny_spec())
    assert priced.part("blocks[0]").activation > 0  # the looked-up ids, saved for the table's gradient
    assert priced.part("blocks[1]").activation >= 4 * 4 * 4  # fm saves its (n_dense, dim) input


def test_export_reads_a_runs_genotype_within_the_limits_and_prices_it(tmp_path: Path) -> None:
    from rankitect.export.exporter import export_from_files

    spec_path = tmp_path / "spec.json"
    tiny_spec().save(spec_path)
    deep = tmp_path / "genotype.json"
    deep.write_text('{"blocks": ' + "[" * 1000 + "]" * 1000 + "}")
    with pytest.raises(DataError, match=f"^{re.escape(str(deep))}: not a valid genotype: JSON nested deeper"):
        export_from_files(deep, spec_path, tmp_path / "none.safetensors", tmp_path / "out")
    wide = tmp_path / "wide.json"
    wide.write_text(_mlp(width=10**12).to_json())
    with pytest.raises(OverBudget, match=re.escape(f"{wide}: blocks[0].params.width=1000000000000: ")):
        export_from_files(wide, spec_path, tmp_path / "none.safetensors", tmp_path / "out")
    assert not (tmp_path / "out").exists()
