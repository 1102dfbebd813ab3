"""The compile runtime: fusion options exist in torch, compiled training equals eager, failures
fall back to eager with one warning and never fail the trial.

Real Inductor compiles take tens of seconds on a small CPU, so these tests compile with the
``eager`` / ``aot_eager`` backends (same Dynamo capture and AOT autograd, no code generation) or
with a backend that raises; ``bench/speed/runtime_bench.py`` measures Inductor itself.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._inductor.fx_passes import group_batch_fusion as gbf

from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.space import build_model
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.testing import tiny_batch, tiny_spec
from rankitect.train.loop import start_at_base_rate, train_model
from rankitect.train.runtime import POST_GRAD_FUSIONS, PRE_GRAD_FUSIONS, CompiledModel, fusion_options
from tests.train.runtime_data import tiny_data

ARCH = Architecture(
    blocks=(BlockGene("mlp", ("dense",), {"width": 8}), BlockGene("dot", ("sparse", 0))),
    head=HeadGene((1, 0), (16,)),
    embedding_dim=4,
)


class CountingBackend:
    """A Dynamo backend that counts the graphs it is handed and runs them as captured."""

    def __init__(self) -> None:
        self.graphs = 0
        self.targets: set[str] = set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs += 1
        self.targets |= {str(node.target) for node in gm.graph.nodes}
        return gm.forward


def failing_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("backend exploded on purpose")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model(ARCH, tiny_spec())


def test_fusion_passes_are_the_ones_torch_registers() -> None:
    opts = fusion_options()
    assert set(opts["pre_grad_fusion_options"]) == set(PRE_GRAD_FUSIONS) & set(gbf.PRE_GRAD_FUSIONS)
    assert set(opts["post_grad_fusion_options"]) == set(POST_GRAD_FUSIONS) & set(gbf.POST_GRAD_FUSIONS)
    assert {"batch_linear", "batch_layernorm", "batch_relu"} <= set(opts["pre_grad_fusion_options"])


def test_compiled_training_forward_and_grads_equal_eager() -> None:
    eager, compiled_model = _model(), _model()
    compiled = CompiledModel(compiled_model, backend="aot_eager")
    batch = tiny_batch(tiny_spec(), 8)
    assert compiled.warm_up(batch) >= 0 and compiled.failed is None
    assert all(p.grad is None for p in compiled_model.parameters())  # warm-up leaves no gradients
    compiled.train()
    out_c, out_e = compiled(batch), eager(batch)
    torch.testing.assert_close(out_c, out_e)
    out_c.sum().backward()
    out_e.sum().backward()
    for (name, pc), pe in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, msg=name)


def test_only_the_training_shape_is_compiled() -> None:
    backend = CountingBackend()
    compiled = CompiledModel(_model(), backend=backend)
    compiled.train()
    for seed in range(3):  # new values, same shape: one graph
        compiled(tiny_batch(tiny_spec(), 8, seed=seed))
    assert backend.graphs == 1
    assert not any("embedding" in t for t in backend.targets)  # the lookup stays eager
    assert any("linear" in t for t in backend.targets)
    short = tiny_batch(tiny_spec(), 6)  # an epoch's short last batch runs eager, no recompile
    torch.testing.assert_close(compiled(short), compiled.model(short))
    compiled.eval()
    with torch.no_grad():
        compiled(tiny_batch(tiny_spec(), 8))
    assert backend.graphs == 1


def test_compile_failure_falls_back_to_eager_with_one_warning() -> None:
    compiled = CompiledModel(_model(), backend=failing_backend)
    batch = tiny_batch(tiny_spec(), 8)
    with pytest.warns(UserWarning, match="torch.compile failed.*exploded on purpose"):
        compiled.warm_up(batch)
    assert compiled.failed is not None
    compiled.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        out = compiled(batch)
    torch.testing.assert_close(out, compiled.model(batch))


@pytest.mark.parametrize("fusion", [True, False])
def test_fusion_options_reach_inductor(fusion: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop Inductor right after its pre-grad passes: the batch-linear fusion ran on the graph
    exactly when asked for."""
    import torch._inductor.compile_fx as cfx
    from torch._dynamo.utils import counters

    real = cfx._recursive_pre_grad_passes

    def stop_after_pre_grad(gm: Any, *args: Any, **kwargs: Any) -> Any:
        real(gm, *args, **kwargs)
        raise RuntimeError("stopped after the pre-grad passes")

    class Parallel(nn.Module):  # six independent same-shape linears: the pass's pattern
        def __init__(self) -> None:
            super().__init__()
            self.linears = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([lin(x[:, i]) for i, lin in enumerate(self.linears)], dim=1)

    monkeypatch.setattr(cfx, "_recursive_pre_grad_passes", stop_after_pre_grad)
    counters.clear()
    compiled = CompiledModel(Parallel(), fusion=fusion)
    with pytest.warns(UserWarning, match="stopped after the pre-grad passes"):
        out = compiled(torch.randn(4, 6, 8))
    assert out.shape == (4, 48)
    assert counters["inductor"]["batch_linear"] == (1 if fusion else 0)


def _fresh(data: Any) -> nn.Module:
    """The model as rankitect trains a new one: built, then started at the base rate."""
    model = build_model(ARCH, data.spec)
    start_at_base_rate(model, data.split("train").ctr)
    return model


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tiny_data(Path(tmp_path_factory.mktemp("rt")) / "tiny")


def test_train_model_with_a_failing_compiler_still_trains(data: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.compile_fx as cfx

    def broken_inductor(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("inductor is broken here")

    monkeypatch.setattr(cfx, "compile_fx", broken_inductor)
    cfg = TrainConfig(steps=16, batch_size=64, val_every=16, val_batches=2, test_batches=2, progress=False, lr_dense=0.005)
    torch.manual_seed(0)
    model = _fresh(data)
    with pytest.warns(UserWarning, match="inductor is broken here") as record:
        out = train_model(model, data, cfg, runtime=RuntimeConfig(compile=True))
    assert sum("torch.compile failed" in str(w.message) for w in record) == 1
    assert out.steps == 16 and out.model is model
    assert 0 < out.metrics["test/ne"] < 2


def test_runtime_none_and_default_runtime_train_alike(data: Any) -> None:
    """The runtime argument with defaults (eager fp32) changes nothing: same seed, same weights."""
    cfg = TrainConfig(steps=16, batch_size=64, val_every=16, val_batches=1, test_batches=1, progress=False, lr_dense=0.005)
    results = []
    for runtime in (None, RuntimeConfig()):
        torch.manual_seed(0)
        results.append(train_model(_fresh(data), data, cfg, runtime=runtime))
    for a, b in zip(results[0].model.parameters(), results[1].model.parameters()):
        torch.testing.assert_close(a, b)


def test_compiled_training_through_the_trainer_matches_eager(data: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The success path end to end: Inductor's entry point swapped for one that runs Dynamo's
    captured graph as is, so compiling is fast; one compile serves every training step and the
    weights after training equal eager training's."""
    import torch._inductor.compile_fx as cfx

    compiles = []

    def run_captured_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        compiles.append(kwargs.get("config_patches"))
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", run_captured_graph)
    cfg = TrainConfig(steps=18, batch_size=96, val_every=18, val_batches=1, test_batches=1, progress=False, lr_dense=0.02,
                      lr_sparse=0.2,
                      grace_steps=18)
    results = []
    for runtime in (None, RuntimeConfig(compile=True)):
        torch.manual_seed(0)
        results.append(train_model(_fresh(data), data, cfg, runtime=runtime))
    assert len(compiles) == 1  # 512 rows / 96: the short sixth batch runs eager, no recompile
    assert "batch_linear" in compiles[0]["pre_grad_fusion_options"]
    for a, b in zip(results[0].model.parameters(), results[1].model.parameters()):
        torch.testing.assert_close(a, b)


def test_bf16_trains_the_products_in_bfloat16_and_keeps_fp32_weights(data: Any) -> None:
    """``runtime.precision=bf16``: every Linear of the training forwards computes in bfloat16
    (autocast), validations and scores in float32, the weights stay float32, and training goes
    where fp32 training goes."""
    cfg = TrainConfig(steps=16, batch_size=64, val_every=16, val_batches=2, test_batches=2, progress=False, lr_dense=0.005)
    seen: list[tuple[bool, torch.dtype]] = []

    def record(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        seen.append((torch.is_grad_enabled(), output.dtype))

    results = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = _fresh(data)
        if precision == "bf16":
            hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
        results[precision] = train_model(model, data, cfg, runtime=RuntimeConfig(precision=precision))
    for h in hooks:
        h.remove()
    training = [dtype for grad, dtype in seen if grad]
    scoring = [dtype for grad, dtype in seen if not grad]  # validations and the test: float32
    assert len(training) == cfg.steps * len(hooks) and set(training) == {torch.bfloat16}
    validations = len(results["bf16"].history)
    assert len(scoring) == (validations * cfg.val_batches + cfg.test_batches) * len(hooks)
    assert set(scoring) == {torch.float32}
    assert all(p.dtype == torch.float32 for p in results["bf16"].model.parameters())
    for a, b in zip(results["fp32"].model.parameters(), results["bf16"].model.parameters()):
        assert not torch.equal(a, b)  # bf16 rounding changed the trajectory ...
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.05)  # ... but not where it went
    assert abs(results["bf16"].metrics["test/ne"] - results["fp32"].metrics["test/ne"]) < 0.02
