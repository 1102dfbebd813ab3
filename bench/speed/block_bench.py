"""Builder overhead: rankitect's built models against hand-written plain-PyTorch twins.

    python -m bench.speed.block_bench                 # batch 512, 30 interleaved repetitions
    python -m bench.speed.block_bench --batch-size 2048 --reps 50 --threads 2

For the DCNv2 baseline and one 7-block ``nasrec`` sample (seed ``--seed``; its table widths per
vocabulary group drawn too, so narrower and wider tables are projected to D), on a Criteo-shaped
spec (13 dense, 26 sparse features, D = 16):

1. builds the rankitect model and a twin with identical shapes, copies the weights into the twin
   and checks that both give the same logits;
2. times one training step (forward, BCE loss, backward) of each, interleaved repetition by
   repetition so that the shared machine's noise hits both alike, and prints the median times and
   ``ratio = twin / rankitect`` (goal >= 0.95: rankitect no slower than the hand-written model).

Twins: ``plain`` looks ids up in one ``nn.Embedding`` per feature from a precomputed ``(B, 26)`` id
tensor and writes every layer with ``torch.nn.functional``; ``ebc`` is the same but embeds through
a torchrec ``EmbeddingBagCollection`` from the batch's ``KeyedJaggedTensor``, as rankitect does, so
its ratio isolates the builder and block overhead from the embedding path.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.common import parse_args
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.space import build_model, cost, get_space
from rankitect.space.architecture import Architecture
from rankitect.space.baselines import dcnv2
from rankitect.space.builder import RankingModel
from rankitect.space.recipe import DIM_GENES
from rankitect.space.recipe_space import default_recipe_menus
from rankitect.space.testing import tiny_batch


def criteo_spec() -> FeatureSpec:
    vocab = np.geomspace(10, 100_000, 26).astype(int)
    return FeatureSpec(
        dense=tuple(DenseFeature(f"i{i}") for i in range(13)),
        sparse=tuple(SparseFeature(f"c{i}", int(v)) for i, v in enumerate(vocab)),
        name="criteo_shaped",
    )


def _p(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


def _ln(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias)


def plain_op(block: nn.Module, op: str) -> tuple[Callable[..., torch.Tensor], nn.Module]:
    """A functional re-implementation of one (unmasked) block and a deep copy holding its weights."""
    m = copy.deepcopy(block)

    def mlp(x: torch.Tensor) -> torch.Tensor:
        layers = list(m.layers)
        for lin, norm in zip(layers[0::3], layers[1::3]):
            x = torch.relu(_ln(F.linear(x, lin.weight, lin.bias), norm))
        return x

    def attention(x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        H = m.num_heads
        q, k, v = F.linear(x, m.qkv.weight, m.qkv.bias).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)  # 3x(B,H,N,Dh)
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H), dim=-1)  # (B,H,N,Dh)@(B,H,Dh,N)
        a = (w @ v).transpose(1, 2).reshape(B, N, D)  # (B,H,N,N)@(B,H,N,Dh) -> (B,N,D)
        y = _ln(x + F.linear(a, m.proj.weight, m.proj.bias), m.norm)
        if m.ffn is not None:
            h = F.linear(torch.relu(F.linear(y, m.ffn[0].weight, m.ffn[0].bias)), m.ffn[2].weight, m.ffn[2].bias)
            y = _ln(y + h, m.ffn_norm)
        return y

    def dot(x: torch.Tensor) -> torch.Tensor:
        N = x.shape[1]
        i, j = torch.triu_indices(N, N, offset=1)
        return torch.bmm(x, x.transpose(1, 2))[:, i, j]  # (B,N,D)@(B,D,N) -> (B,N,N) -> (B,P)

    ops: dict[str, Callable[..., torch.Tensor]] = {
        "mlp": mlp,
        "attention": attention,
        "dot": dot,
        "efc": lambda x: F.linear(x.transpose(1, 2), m.linear.weight, m.linear.bias).transpose(1, 2),
        "fm": lambda x: 0.5 * (x.sum(1) ** 2 - (x * x).sum(1)),
        "gating": lambda a, b: F.linear(
            b * torch.sigmoid(F.linear(a, m.gate.weight, m.gate.bias)), m.proj.weight, m.proj.bias
        ),
        "sum": lambda a, b: torch.relu(F.linear(a, m.left.weight, m.left.bias) + F.linear(b, m.right.weight)),
        "dcn": lambda x: _cross(x, m),
    }
    return ops[op], m


def _cross(x0: torch.Tensor, m: nn.Module) -> torch.Tensor:
    x = x0
    for layer in m.layers:
        h = x if isinstance(layer.down, nn.Identity) else F.linear(x, layer.down.weight)
        x = x0 * F.linear(h, layer.up.weight, layer.up.bias) + x
    return x


class Twin(nn.Module):
    """A hand-written, straight-line re-implementation of one built model with copied weights."""

    def __init__(self, model: RankingModel, *, ebc: bool) -> None:
        super().__init__()
        self.arch, spec = model.arch, model.spec
        self.D = model.arch.embedding_dim
        self.use_ebc = ebc
        order = [f.name for f in spec.sparse_in_field_order()]
        self.columns = [spec.sparse_names.index(n) for n in order]
        if ebc:
            self.ebc = copy.deepcopy(model.embedding.ebc)
        else:
            self.tables = nn.ModuleList(
                nn.Embedding.from_pretrained(model.embedding.table(n).detach().clone(), freeze=False) for n in order
            )
        self.fns = []
        self.holders = nn.ModuleList()
        self.projs = nn.ParameterList()
        for gene, adapter, block in zip(self.arch.blocks, model.adapters, model.blocks):
            fn, holder = plain_op(block, gene.op)
            self.fns.append(fn)
            self.holders.append(holder)
            if adapter.proj is not None:
                self.projs.extend([_p(adapter.proj.weight), _p(adapter.proj.bias)])
        self.head = copy.deepcopy(model.head.mlp)
        # Tables narrower or wider than D (the recipe's widths): each group's fields and projection.
        self.dims = list(model.embedding.dims)
        self.groups = [(fields, _p(model.embedding.projections[g].weight))
                       for g, fields in model.embedding.projected.items()]
        self.group_weights = nn.ParameterList([w for _, w in self.groups])

    def embed(self, batch_sparse: object, ids: torch.Tensor) -> torch.Tensor:
        if self.use_ebc:
            rows = self.ebc(batch_sparse).values()  # (B, sum_k d_k), fields side by side
            if not self.groups:
                return rows.view(ids.shape[0], -1, self.D)  # (B, n*D) -> (B, n, D)
            parts = list(rows.split(self.dims, dim=1))  # n x (B, d_k)
        else:
            parts = [t(ids[:, c]) for t, c in zip(self.tables, self.columns)]  # n x (B, d_k)
        for fields, w in self.groups:
            out = F.linear(torch.stack([parts[k] for k in fields], dim=1), w)  # (B, n_g, d_g) -> (B, n_g, D)
            for j, k in enumerate(fields):
                parts[k] = out[:, j]
        return torch.stack(parts, dim=1)  # n x (B, D) -> (B, n, D)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, sparse: object) -> torch.Tensor:
        emb = self.embed(sparse, ids)
        outs: list[torch.Tensor] = []
        src = {"dense": dense, "sparse": emb}
        B, proj = dense.shape[0], 0
        for gene, fn in zip(self.arch.blocks, self.fns):
            xs = [src[r] if isinstance(r, str) else outs[r] for r in gene.inputs]
            if gene.in_kind == "field":
                fields = [x for x in xs if x.dim() == 3]
                flats = [x for x in xs if x.dim() == 2]
                if flats:
                    w, b = self.projs[proj], self.projs[proj + 1]
                    proj += 2
                    fields.append(F.linear(torch.cat(flats, 1), w, b).view(B, gene.tokens, self.D))  # (B,T*D)->(B,T,D)
                outs.append(fn(torch.cat(fields, 1)))
            else:
                flat = [x.flatten(1) for x in xs]  # (B, N, D) -> (B, N*D)
                if gene.op in ("gating", "sum"):
                    outs.append(fn(flat[0], torch.cat(flat[1:], 1) if len(flat) > 1 else flat[0]))
                else:
                    outs.append(fn(torch.cat(flat, 1)))
        feats = torch.cat([(src[r] if isinstance(r, str) else outs[r]).flatten(1) for r in self.arch.head.inputs], 1)
        return self.head(feats).squeeze(-1)  # (B, 1) -> (B,)


def step(fn: Callable[[], torch.Tensor], labels: torch.Tensor, params: list[nn.Parameter]) -> float:
    for p in params:
        p.grad = None
    start = time.perf_counter()
    F.binary_cross_entropy_with_logits(fn(), labels).backward()
    return time.perf_counter() - start


def compare(
    name: str, arch: Architecture, spec: FeatureSpec, args: argparse.Namespace
) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    model = build_model(arch, spec)
    batch = tiny_batch(spec, args.batch_size, seed=1)
    ids = batch.sparse_ids().contiguous()
    runners: dict[str, Callable[[], torch.Tensor]] = {"rankitect": lambda: model(batch)}
    params = {"rankitect": list(model.parameters())}
    for kind in ("plain", "ebc"):
        twin = Twin(model, ebc=kind == "ebc")
        with torch.no_grad():
            torch.testing.assert_close(twin(batch.dense, ids, batch.sparse), model(batch), rtol=1e-4, atol=1e-5)
        runners[kind] = lambda t=twin: t(batch.dense, ids, batch.sparse)
        params[kind] = list(twin.parameters())
    times: dict[str, list[float]] = {k: [] for k in runners}
    for rep in range(args.reps + args.warmup):
        for k in (list(runners) if rep % 2 == 0 else list(runners)[::-1]):
            t = step(runners[k], batch.labels, params[k])
            if rep >= args.warmup:
                times[k].append(t)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    mflops = cost(arch, spec).mflops
    print(f"{name}: {len(arch.blocks)} genes, {mflops:.2f} MFLOPs/example; outputs equal (plain and ebc twins)")
    return [(f"{name} vs {k} twin", ms["rankitect"], ms[k]) for k in ("plain", "ebc")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="seed of the nasrec sample")
    ap.add_argument("--threads", type=int, default=1)
    args = parse_args(ap, {"batch_size": 64, "reps": 2, "warmup": 1}, argv)
    torch.set_num_threads(args.threads)
    spec = criteo_spec()
    # Table widths are the one recipe choice: a twin has no dropout draws of its own to match, and
    # norms other than layer norms would need twins of their own.
    space = get_space("nasrec", recipe={g: default_recipe_menus(16)[g] for g in DIM_GENES})
    sample = space.decode(space.sample(np.random.default_rng(args.seed)))
    rows = compare("dcnv2", dcnv2(spec), spec, args) + compare("nasrec", sample, spec, args)
    print(f"\nbatch {args.batch_size}, {args.reps} interleaved reps, {args.threads} thread(s); median step ms")
    print(f"{'comparison':<26}{'rankitect':>11}{'twin':>11}{'ratio':>8}")
    for label, ours, theirs in rows:
        print(f"{label:<26}{ours:>11.2f}{theirs:>11.2f}{theirs / ours:>8.3f}")


if __name__ == "__main__":
    main()
