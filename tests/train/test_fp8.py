"""The FP8 probe: emulated e4m3 casts against a by-hand rounding, errors against an independent
computation, outlier layers flagged unsafe, the GPU requirement, torchao conversion and the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rankitect.blocks.common import FieldLinear, MaskedLinear
from rankitect.cli import main
from rankitect.config import RuntimeConfig, TrainConfig
from rankitect.errors import UserError
from rankitect.train.fp8 import (
    convert_fp8_layers,
    convertible,
    fake_fp8,
    fp8_linear_error,
    probe_model,
    require_fp8_device,
)
from tests.train.runtime_data import tiny_data


def e4m3(v: float) -> float:
    """Round to the nearest float8 e4m3fn value by hand: 3 mantissa bits, exponents from -6
    (subnormal spacing 2^-9), ties to even, saturated at 448."""
    a = abs(v)
    if a == 0.0:
        return 0.0
    exp = max(math.floor(math.log2(a)), -6)
    step = 2.0 ** (exp - 3)
    return math.copysign(min(round(a / step) * step, 448.0), v)  # round(): ties to even


def e4m3_array(x: np.ndarray) -> np.ndarray:
    return np.vectorize(e4m3)(x)


def test_e4m3_cast_of_known_values() -> None:
    # amax 448 makes the scale exactly 1, so this checks the cast alone
    values = [448.0, 1.0, 1.0625, 1.1, 3.3, 17.0, 300.0, 0.3, 0.013, 2**-10, 3 * 2**-10, -5.5, -100.0]
    got = fake_fp8(torch.tensor(values)).tolist()
    assert got == [e4m3(v) for v in values]
    assert got[2] == 1.0 and got[5] == 16.0 and got[9] == 0.0 and got[10] == 2**-8  # ties to even


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_scaled_cast_matches_by_hand(scaling: str) -> None:
    x = np.random.default_rng(0).standard_normal((5, 7)) * np.array([[1], [10], [0.01], [100], [1]])
    amax = np.abs(x).max(axis=1, keepdims=True) if scaling == "rowwise" else np.abs(x).max()
    scale = 448.0 / amax
    expected = e4m3_array(x * scale) / scale
    got = fake_fp8(torch.tensor(x, dtype=torch.float32), scaling=scaling).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)


def test_linear_error_matches_an_independent_computation() -> None:
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((32, 16)), rng.standard_normal((8, 16)) * 0.3, rng.standard_normal(8)
    x32, w32 = x.astype(np.float32).astype(np.float64), w.astype(np.float32).astype(np.float64)
    qx = e4m3_array(x32 * 448 / np.abs(x32).max()) * np.abs(x32).max() / 448
    qw = e4m3_array(w32 * 448 / np.abs(w32).max()) * np.abs(w32).max() / 448
    exact, emulated = x32 @ w32.T + b, qx @ qw.T + b
    expected = np.linalg.norm(emulated - exact) / np.linalg.norm(exact)
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    got = fp8_linear_error(t(x), t(w), t(b), scaling="tensorwise")
    assert got == pytest.approx(expected, rel=1e-3)
    assert 0.005 < got < 0.1  # e4m3 keeps 3 mantissa bits: a few percent


class TwoLayers(nn.Module):
    """``well`` reads standard-normal features; ``outlier`` the same plus a raw count column
    (values near 1e6, like an untransformed impression count) that it learned to ignore."""

    def __init__(self) -> None:
        super().__init__()
        self.well = nn.Linear(16, 16)
        self.outlier = nn.Linear(16, 16)
        with torch.no_grad():
            self.outlier.weight[:, 0] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = torch.cat([torch.full_like(x[:, :1], 1e6), x[:, 1:]], dim=1)
        return self.well(x) + self.outlier(raw)


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_outlier_layer_is_unsafe_and_well_scaled_one_safe(scaling: str) -> None:
    torch.manual_seed(0)
    model = TwoLayers()
    report = probe_model(model, [torch.randn(64, 16) for _ in range(3)], threshold=0.1, scaling=scaling)
    errors = {layer.name: layer.error(scaling) for layer in report.layers}
    assert errors["well"] < 0.1 < 0.5 < errors["outlier"]
    assert report.safe_layers() == ["well"] and report.fp8_layers() == ["well"]
    assert report.batches == 3 and model.training  # mode restored
    assert not model.well._forward_hooks  # hooks removed
    table = report.table()
    assert list(table["name"]) == ["well", "outlier"] and list(table["safe"]) == [True, False]


def test_field_and_masked_layers_probe_the_product_they_compute() -> None:
    torch.manual_seed(0)
    lin = FieldLinear(6, 4, request_in=2, request_out=1)  # along the field axis, masked
    x = torch.randn(8, 6, 5)  # (B, N, D)
    report = probe_model(lin, [x], threshold=0.1, scaling="rowwise")
    # by hand: (B, N, D) -> (B, D, N) -> (B*D, N) times the masked weight
    expected = fp8_linear_error(x.transpose(1, 2).reshape(-1, 6), lin.weight * lin.mask, lin.bias, scaling="rowwise")
    assert report.layers[0].rowwise == pytest.approx(expected, rel=1e-9)
    assert not report.layers[0].convertible


def test_convertible_means_torchao_computes_the_same() -> None:
    assert convertible(nn.Linear(16, 32)) and convertible(MaskedLinear(16, 32))
    assert not convertible(nn.Linear(16, 1)) and not convertible(nn.Linear(13, 16))
    assert not convertible(MaskedLinear(16, 32, request_in=4, request_out=8))  # the mask would be lost
    assert not convertible(FieldLinear(16, 16))  # the transpose would be lost


def test_fp8_needs_a_capable_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match=r"capability >= 8\.9.*runtime.device is 'cpu'"):
        require_fp8_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"8\.9.*no CUDA device"):
        require_fp8_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    with pytest.raises(UserError, match=r"A100 has 8\.0"):
        require_fp8_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    assert require_fp8_device("cuda:0") == torch.device("cuda:0")


def test_fp8_training_refuses_before_reading_data() -> None:
    from rankitect.space import build_model, get_baseline
    from rankitect.space.testing import tiny_spec
    from rankitect.train.loop import train_model

    model = build_model(get_baseline("dlrm", tiny_spec(), embedding_dim=4), tiny_spec())
    cfg = TrainConfig(steps=2, batch_size=32, progress=False)
    with pytest.raises(UserError, match=r"precision=fp8 needs a CUDA GPU"):
        train_model(model, None, cfg, runtime=RuntimeConfig(precision="fp8"))


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_torchao_converts_only_the_safe_convertible_layers(scaling: str) -> None:
    pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = TwoLayers()
    model.add_module("masked", MaskedLinear(16, 16, request_in=4, request_out=4))
    report = probe_model(model, [torch.randn(32, 16)], threshold=0.1, scaling=scaling)
    assert "masked" in report.safe_layers() and "masked" not in report.fp8_layers()
    before = model.well.weight.detach().clone()
    assert convert_fp8_layers(model, report.fp8_layers(), scaling=scaling, emulate=True) == ["well"]
    assert type(model.well).__name__ == "Float8Linear"
    assert type(model.outlier) is nn.Linear and type(model.masked) is MaskedLinear
    assert torch.equal(model.well.weight.detach(), before)  # same parameters, now run in FP8
    x = torch.randn(32, 16)
    out = model.well(x)
    exact = nn.functional.linear(x, before, model.well.bias)
    assert 0 < float((out - exact).norm() / exact.norm()) < 0.1
    out.sum().backward()
    assert model.well.weight.grad is not None
    with pytest.raises(ValueError, match="'masked' is not a convertible"):
        convert_fp8_layers(model, ["masked"], scaling=scaling, emulate=True)


def test_probe_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``rankitect probe`` on a baseline (random init) and on a tracked run, whose kept weights are
    probed rather than a fresh initialisation (a zeroed layer outputs its bias alone, which FP8
    leaves exact); bad targets end in one line and status 2."""
    from rankitect.eval.result import TrialResult
    from rankitect.space import build_model, get_baseline
    from rankitect.track import Tracker
    from rankitect.track.weights import save_weights

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    data = tiny_data(tmp_path / "tiny", rows=128)
    opts = ["--batches", "2", f"data.source={tmp_path / 'tiny'}", "train.batch_size=64"]
    assert main(["probe", "baseline:dlrm", "--threshold", "0.2", *opts]) == 0
    out = capsys.readouterr().out
    assert "head.mlp.0" in out and "random init" in out and "relative error <= 0.2" in out

    arch = get_baseline("dlrm", data.spec, embedding_dim=4)
    model = build_model(arch, data.spec)
    with torch.no_grad():
        model.head.mlp[0].weight.zero_()
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    data.spec.save(tmp_path / "spec.json")
    tracker = Tracker()
    run_id = tracker.log_trial(None, arch, TrialResult.from_metrics({"val/ne": 0.9}, mflops=1.0))
    tracker.log_model_files(run_id, tmp_path / "w.safetensors", tmp_path / "spec.json")
    assert main(["probe", run_id, *opts]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["head.mlp.0"][4:6] == ["0.0000", "0.0000"]  # tensorwise, rowwise
    assert float(rows["head.mlp.2"][4]) > 0.0

    assert main(["probe", "baseline:nope", *opts]) == 2
    assert main(["probe", "no-such-run", *opts]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err
