"""torch.compile (Inductor, with and without the Optimus batch-fusion passes) against eager.

    python -m bench.speed.runtime_bench                      # batch 512, 20 interleaved steps
    python -m bench.speed.runtime_bench --steps 50 --threads 2 --models dcnv2

For the DCNv2 baseline and one ``nasrec`` sample (seed ``--seed``) on a Criteo-shaped spec (13 dense,
26 sparse features, D = 16), three copies of one initialisation train side by side with the
optimizers of training (row-wise Adagrad for the tables, Adam for the rest):

1. ``compiled`` and ``compiled+fusion`` are compiled through :class:`CompiledModel` (the dense
   part, forward and backward, in one warm-up step) with Inductor's caches off, so each compile is
   as cold as a new candidate's (``--cache`` keeps them); the compile seconds and the fusion passes
   that fired are printed;
2. the first step's logits of the three copies are checked equal (same weights, same batch);
3. then ``--steps`` training steps are timed, interleaved copy by copy so that the shared
   machine's noise hits all alike; printed: median ms per step, ``speed-up = eager / compiled``,
   and the break-even step count ``compile seconds / (eager - compiled step time)``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch._inductor.config
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from bench.common import parse_args
from bench.speed.block_bench import criteo_spec
from rankitect.config import TrainConfig
from rankitect.space import build_model, cost, get_space
from rankitect.space.baselines import dcnv2
from rankitect.space.testing import tiny_batch
from rankitect.train.runtime import CompiledModel
from rankitect.train.task import RankingTask

Step = Callable[[Any], None]


def make_step(module: nn.Module, model: nn.Module) -> Step:
    """One training step of ``module`` (which runs ``model``) with training's two optimizers."""
    opts = RankingTask(model, TrainConfig()).configure_optimizers()

    def step(batch: Any) -> None:
        loss = F.binary_cross_entropy_with_logits(module(batch), batch.labels)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in opts:
            opt.step()

    return step


def compile_copy(model: nn.Module, batch: Any, *, fusion: bool) -> tuple[CompiledModel, float, dict[str, int]]:
    counters.clear()
    compiled = CompiledModel(model, fusion=fusion)
    seconds = compiled.warm_up(batch)
    if compiled.failed:
        raise RuntimeError(f"compile failed: {compiled.failed}")
    fired = {k: v for k, v in counters["inductor"].items() if k.startswith(("batch_", "group_"))}
    return compiled, seconds, fired


def bench(name: str, arch: Any, args: argparse.Namespace) -> None:
    spec = criteo_spec()
    torch.manual_seed(args.seed)
    base = build_model(arch, spec)
    batches = [tiny_batch(spec, args.batch_size, seed=s, per_request=4) for s in range(8)]
    print(f"\n{name}: {cost(arch, spec).mflops:.3f} MFLOPs/example, batch {args.batch_size}")
    models = {"eager": base, "compiled": copy.deepcopy(base), "compiled+fusion": copy.deepcopy(base)}
    modules: dict[str, nn.Module] = {"eager": base}
    compile_s: dict[str, float] = {}
    for label, fusion in (("compiled", False), ("compiled+fusion", True)):
        modules[label], compile_s[label], fired = compile_copy(models[label], batches[0], fusion=fusion)
        print(f"  compile {label:16s} {compile_s[label]:6.1f} s   fusion passes fired: {fired or 'none'}")
    for module in modules.values():
        module.train()
    with torch.no_grad():
        ref = base(batches[1])
        for label in ("compiled", "compiled+fusion"):
            torch.testing.assert_close(modules[label](batches[1]), ref, rtol=1e-4, atol=1e-4)
    steps = {label: make_step(modules[label], models[label]) for label in modules}
    times: dict[str, list[float]] = {label: [] for label in modules}
    for i in range(args.steps + 2):
        for label, step in steps.items():
            start = time.perf_counter()
            step(batches[i % len(batches)])
            if i >= 2:  # the first steps also build optimizer state
                times[label].append(time.perf_counter() - start)
    med = {label: statistics.median(t) * 1e3 for label, t in times.items()}
    print("  median step ms:  " + "  ".join(f"{label} {ms:.2f}" for label, ms in med.items()))
    for label in ("compiled", "compiled+fusion"):
        saved = (med["eager"] - med[label]) / 1e3
        even = f"{compile_s[label] / saved:,.0f} steps" if saved > 0 else "never (not faster)"
        print(f"  {label:16s} speed-up {med['eager'] / med[label]:.2f}x   break-even after {even}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default="dcnv2,nasrec")
    p.add_argument("--cache", action="store_true", help="keep Inductor's on-disk caches (warm compiles)")
    args = parse_args(p, {"batch_size": 64, "steps": 2, "models": "dcnv2"}, argv)
    torch.set_num_threads(args.threads)
    torch._inductor.config.force_disable_caches = not args.cache
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} timed steps per copy")
    spec = criteo_spec()
    space = get_space("nasrec")
    archs = {"dcnv2": dcnv2(spec), "nasrec": space.decode(space.sample(np.random.default_rng(args.seed)))}
    for name in args.models.split(","):
        bench(name, archs[name], args)


if __name__ == "__main__":
    main()
