"""FP8 with a safety probe: which linear layers keep their outputs when run in float8 (LoKA-style).

The probe runs real batches through a model and, for every ``nn.Linear``, recomputes the layer's
matrix product with weight and input cast to ``float8_e4m3fn`` and back (emulated, fp32 matmul),
so it works on any CPU:

    y = x Wᵀ + b,   ŷ = q(x) q(W)ᵀ + b,   q(t) = fp8(t · s) / s,   s = 448 / amax(|t|)

``amax`` is taken over the whole tensor (``tensorwise``) or over each row of the product's inner
dimension (``rowwise``: each input row, each output row of ``W``), as torchao's recipes of the same
names scale. A layer's error is ``‖ŷ - y‖ / ‖y‖`` (Frobenius, summed over every probed batch); it
is *safe* when that is at most the threshold. The input the hook sees is the true fp32 activation,
so each layer's error is its own, not the accumulation of the layers before it.

``runtime.precision=fp8`` converts only the safe layers that torchao can take over unchanged
(:func:`convertible`: plain linear semantics, both sizes multiples of 16) with
``torchao.float8.convert_to_float8_training``, on CUDA GPUs of capability >= 8.9; elsewhere it
refuses with a :class:`~rankitect.errors.UserError` (:func:`require_fp8_device`).

Masked layers (ROCS) and field-axis layers stay in full precision: torchao's ``Float8Linear``
replaces the module's ``forward``, which would drop the mask or the transpose.

>>> x = torch.tensor([[1.1, 300.0, 0.3]])
>>> fake_fp8(x, scaling="tensorwise").tolist()  # scale 448/300: 1.1 -> 1.643 -> 1.625 (3 mantissa bits)
[[1.0881696939468384, 300.0, 0.29296875]]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from rankitect.blocks.common import FieldLinear, MaskedLinear
from rankitect.errors import UserError

Scaling = Literal["tensorwise", "rowwise"]
SCALINGS: tuple[str, ...] = ("tensorwise", "rowwise")
E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
AMAX_EPS = 1e-12  # an all-zero tensor gets a finite scale (its cast is exact anyway)
MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with FP8 tensor cores (torch._scaled_mm)
FP8_ALIGN = 16  # torch._scaled_mm needs both matrix sizes divisible by 16


def fake_fp8(x: torch.Tensor, *, scaling: str = "tensorwise") -> torch.Tensor:
    """``x`` scaled to the e4m3 range, cast to ``float8_e4m3fn``, cast back and unscaled (fp32).

    ``rowwise`` scales each row (last axis) by its own amax; ``tensorwise`` uses one amax.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True) if scaling == "rowwise" else x.abs().amax()
    scale = E4M3_MAX / amax.clamp(min=AMAX_EPS)
    # clamp first: values past 448 cast to NaN in e4m3fn (it has no infinity)
    q = (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float()
    return q / scale


def fp8_error_terms(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, scaling: str
) -> tuple[float, float]:
    """``(‖ŷ - y‖², ‖y‖²)`` of one product ``x Wᵀ + b`` with ``x`` ``(M, K)``, ``W`` ``(N, K)``."""
    x, weight = x.detach().float(), weight.detach().float()
    bias = bias.detach().float() if bias is not None else None
    exact = F.linear(x, weight, bias)  # (M, K) @ (K, N) -> (M, N)
    emulated = F.linear(fake_fp8(x, scaling=scaling), fake_fp8(weight, scaling=scaling), bias)
    return float((emulated - exact).double().pow(2).sum()), float(exact.double().pow(2).sum())


def fp8_linear_error(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, scaling: str = "tensorwise"
) -> float:
    """Relative error ``‖ŷ - y‖ / ‖y‖`` of ``x Wᵀ + b`` in emulated FP8 (see the module docstring)."""
    err, ref = fp8_error_terms(x.reshape(-1, x.shape[-1]), weight, bias, scaling=scaling)
    return math.sqrt(err / ref) if ref > 0 else (0.0 if err == 0 else math.inf)


def convertible(module: nn.Module) -> bool:
    """Whether torchao's ``Float8Linear`` computes what ``module`` does: a plain linear map
    (an unmasked :class:`MaskedLinear` is one; masked or field-axis ones are not) with both
    sizes multiples of 16."""
    plain = type(module) is nn.Linear or (type(module) is MaskedLinear and module.mask is None)
    return plain and module.in_features % FP8_ALIGN == 0 and module.out_features % FP8_ALIGN == 0


def _operands(module: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The product a linear layer computes on its input: ``(x as (M, K), W (N, K), b)``."""
    if isinstance(module, FieldLinear):
        x = x.transpose(1, 2)  # (B, N, D) -> (B, D, N): the map runs along the field axis
    weight = module.masked_weight() if isinstance(module, MaskedLinear) else module.weight
    return x.reshape(-1, x.shape[-1]), weight, module.bias  # (..., K) -> (M, K)


@dataclass
class LayerError:
    """One linear layer's emulated FP8 error under both scalings (NaN if no batch reached it)."""

    name: str
    kind: str
    in_features: int
    out_features: int
    tensorwise: float
    rowwise: float
    convertible: bool

    def error(self, scaling: str) -> float:
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
        return self.tensorwise if scaling == "tensorwise" else self.rowwise


@dataclass
class ProbeReport:
    """The probe's per-layer errors and the rule that marks a layer safe."""

    layers: list[LayerError]
    threshold: float
    scaling: str
    batches: int

    def is_safe(self, layer: LayerError) -> bool:
        err = layer.error(self.scaling)
        return math.isfinite(err) and err <= self.threshold

    def safe_layers(self) -> list[str]:
        """Names of the layers below the threshold (convertible or not)."""
        return [layer.name for layer in self.layers if self.is_safe(layer)]

    def fp8_layers(self) -> list[str]:
        """Names of the layers ``runtime.precision=fp8`` converts: safe and convertible."""
        return [layer.name for layer in self.layers if self.is_safe(layer) and layer.convertible]

    def table(self) -> pd.DataFrame:
        rows = [{**dataclasses.asdict(layer), "safe": self.is_safe(layer)} for layer in self.layers]
        cols = ["name", "kind", "in_features", "out_features", "tensorwise", "rowwise", "safe", "convertible"]
        return pd.DataFrame(rows, columns=cols)

    def summary(self) -> str:
        return (f"{len(self.safe_layers())} of {len(self.layers)} linear layers safe in FP8 ({self.scaling} "
                f"scaling, relative error <= {self.threshold:g}, {self.batches} batches); "
                f"{len(self.fp8_layers())} would be converted")


def probe_model(
    model: nn.Module, batches: Iterable[Any], *, threshold: float, scaling: str = "rowwise",
) -> ProbeReport:
    """Run ``batches`` through ``model`` (eval mode, no grad) and measure every linear's FP8 error.

    ``model(batch)`` must run each batch; the model's mode is restored afterwards.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    sums = {name: [0.0, 0.0, 0.0, 0.0] for name in linears}  # err²/ref² per scaling

    def hook_for(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            x, w, b = _operands(module, args[0])
            for i, s in enumerate(SCALINGS):
                err, ref = fp8_error_terms(x, w, b, scaling=s)
                sums[name][2 * i] += err
                sums[name][2 * i + 1] += ref
        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in linears.items()]
    was_training, n = model.training, 0
    try:
        model.eval()
        with torch.no_grad():
            for batch in batches:
                model(batch)
                n += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    layers = [LayerError(name, type(m).__name__, m.in_features, m.out_features, _rel(*sums[name][:2]),
                         _rel(*sums[name][2:]), convertible(m)) for name, m in linears.items()]
    return ProbeReport(layers, threshold, scaling, n)


def _rel(err: float, ref: float) -> float:
    if ref == 0.0:
        return 0.0 if err == 0.0 else math.nan
    return math.sqrt(err / ref)


def require_fp8_device(device: str) -> torch.device:
    """The CUDA device of ``device`` if it can train in FP8 (capability >= 8.9), else UserError."""
    need = f"runtime.precision=fp8 needs a CUDA GPU of compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
    dev = torch.device(device)
    if dev.type != "cuda":
        raise UserError(f"{need} (Ada, Hopper or newer); runtime.device is {device!r}: set runtime.device=cuda")
    if not torch.cuda.is_available():
        raise UserError(f"{need}; this machine has none (torch {torch.__version__} sees no CUDA device)")
    cap = torch.cuda.get_device_capability(dev)
    if tuple(cap) < MIN_CAPABILITY:
        raise UserError(f"{need}; {torch.cuda.get_device_name(dev)} has {cap[0]}.{cap[1]}")
    return dev


def convert_fp8_layers(model: nn.Module, names: Iterable[str], *, scaling: str, emulate: bool = False) -> list[str]:
    """Swap the named linears of ``model`` for torchao ``Float8Linear`` (in place); returns them.

    ``emulate`` runs the float8 matmuls in fp32 (torchao's emulation: CPU tests); on a GPU leave
    it off. Only :func:`convertible` layers are accepted.
    """
    chosen = set(names)
    modules = dict(model.named_modules())
    for name in sorted(chosen):
        if name not in modules or not convertible(modules[name]):
            raise ValueError(f"layer {name!r} is not a convertible linear layer of the model")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise UserError(f"runtime.precision=fp8 needs torchao (pip install torchao): {e}") from None
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(scaling), emulate=emulate)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in chosen)
    return sorted(chosen)


__all__ = [
    "E4M3_MAX",
    "SCALINGS",
    "LayerError",
    "ProbeReport",
    "convert_fp8_layers",
    "convertible",
    "fake_fp8",
    "fp8_linear_error",
    "probe_model",
    "require_fp8_device",
]
