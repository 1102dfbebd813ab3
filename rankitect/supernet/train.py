"""What one-shot and DNAS share: training a supernet on paths, scoring a path, logging curves.

The supernet is trained like a candidate (:class:`~rankitect.train.task.RankingTask`): binary
cross-entropy, row-wise Adagrad on the embedding tables and Adam on everything else. Adam runs on
the cuts a path uses (:class:`SliceAdam`): each cut is a leaf tensor of the path's own size, and its
update is written back into its place in the widest weight. A step then costs what the path costs,
not what the widest blocks weigh, and units the path does not use keep their weights and moments.
Both strategies size their training to the data the same way (:func:`supernet_schedule`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim.adam import adam

from rankitect.config import TrainConfig
from rankitect.data.batch import Batch
from rankitect.data.clickdata import epoch_batches
from rankitect.errors import ConfigError
from rankitect.eval.metrics import MetricAccumulator, entropy
from rankitect.supernet.model import Supernet
from rankitect.supernet.memory import SupernetMemory, estimate_supernet_memory, physical_memory
from rankitect.supernet.cut import Index, pick
from rankitect.blocks.buckets import unset_buckets
from rankitect.train.loop import BatchStream, edge_rows
from rankitect.train.task import split_parameters
from rankitect.train.optim import RowWiseAdagrad

Path = Mapping[str, Any]


def build_supernet(space: Any, spec: Any, seed: int) -> Supernet:
    """The supernet of ``space`` with weights drawn from ``seed`` (the global random state is kept)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Supernet(space, spec)


def memory_budget(gb: float | None) -> int | None:
    """``runtime.memory_budget`` in bytes: ``gb`` GB, or half this machine's RAM when ``None``."""
    if gb is None:
        ram = physical_memory()
        return ram // 2 if ram else None
    return int(gb * 1e9)


def check_supernet_memory(space: Any, spec: Any, budget_gb: float | None, flops_range: Any) -> SupernetMemory:
    """Estimate the supernet of ``space`` before it is built; refuse one above the budget, naming the
    config keys that shrink it (the largest part first)."""
    memory = estimate_supernet_memory(space, spec)
    budget = memory_budget(budget_gb)
    if budget is None or memory.total <= budget:
        return memory
    dense = ("search.flops_range (a lower upper end narrows the width menus; now "
             f"{flops_range!r}) or search.space (e.g. nasrec instead of {space.name})")
    tables = f"data.vocab_size (hashing buckets per column: {memory.embedding_rows:,} embedding rows now)"
    keys = [tables, dense] if memory.embedding_params > memory.dense_params else [dense, tables]
    raise ConfigError(f"the {space.name} supernet needs about {memory.describe()}, above runtime.memory_budget "
                      f"({budget / 1e9:.2f} GB); shrink it with {keys[0]}, or {keys[1]}; "
                      "or raise runtime.memory_budget")


def supernet_schedule(
    max_steps: int, warmup_steps: int, epochs: float, train_rows: int, batch_size: int,
) -> tuple[int, int]:
    """Weight steps and warmup steps of a supernet trained on ``train_rows`` training rows.

    ``max_steps`` or ``epochs`` passes over the train split, whichever is fewer: a candidate
    trains for several epochs under the training protocol, so a supernet that sees each row about
    once costs about one training whatever the data's size. The warmup keeps its share of the
    steps (``warmup_steps`` of ``max_steps``).

    >>> supernet_schedule(300, 50, 1.0, 80_000, 512), supernet_schedule(300, 50, 1.0, 10**6, 512)
    ((156, 26), (300, 50))
    """
    per_epoch = epoch_batches(train_rows, batch_size)
    steps = max(1, min(max_steps, math.ceil(epochs * per_epoch)))
    return steps, warmup_steps * steps // max_steps


def batches(split: Any, batch_size: int, seed: int) -> Iterator[Batch]:
    """Shuffled batches of ``split`` forever, a new shuffle each epoch."""
    return iter(BatchStream(split, batch_size, shuffle=True, seed=seed, repeat=True))


def set_bucket_edges(supernet: Supernet, split: Any, seed: int) -> None:
    """Set the edges of the supernet's unset buckets blocks from :func:`~rankitect.train.loop.edge_rows`
    of ``split``, as a candidate's training does (:func:`~rankitect.train.loop.set_bucket_edges`).
    A supernet's buckets site reads every dense feature, standardized (``flats`` of ``dense``), so
    its widest block is called on them directly: no path has to run."""
    blocks = [b for b in unset_buckets(supernet) if b.n == supernet.spec.n_dense]
    if not blocks or len(split) == 0:
        return
    with torch.no_grad():
        dense = supernet.standardize(edge_rows(split, seed).dense)
        for block in blocks:
            was_training = block.training
            block.train()
            block(dense)
            block.train(was_training)


def frozen(t: torch.Tensor, *index: Index) -> torch.Tensor:
    """A cut without gradient into the supernet (architecture steps leave its weights alone)."""
    return pick(t, *index).detach()


def _split(t: torch.Tensor, index: tuple[Index, ...]) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]:
    """The prefix cuts of ``t`` as a view, and the gathered axes with their positions."""
    view, gathered = t, []
    for dim, idx in enumerate(index):
        if isinstance(idx, int):
            view = view.narrow(dim, 0, idx)
        elif idx is not None:
            gathered.append((dim, idx))
    return view, gathered


def _read(t: torch.Tensor, index: tuple[Index, ...]) -> torch.Tensor:
    """A copy of the cut ``pick(t, *index)``."""
    view, gathered = _split(t, index)
    if not gathered:
        return view.clone()
    for dim, idx in gathered:
        view = view.index_select(dim, idx)
    return view


def _write(t: torch.Tensor, index: tuple[Index, ...], values: torch.Tensor) -> None:
    """Put ``values`` where the cut ``pick(t, *index)`` came from."""
    view, gathered = _split(t, index)
    _put(view, gathered, values)


def _put(view: torch.Tensor, gathered: list[tuple[int, torch.Tensor]], values: torch.Tensor) -> None:
    if not gathered:
        view.copy_(values)
        return
    (dim, idx), rest = gathered[0], gathered[1:]
    if not rest:
        view.index_copy_(dim, idx, values)
        return
    inner = view.index_select(dim, idx)  # gather one axis, write the others into it, scatter it back
    _put(inner, rest, values)
    view.index_copy_(dim, idx, inner)


class SliceAdam:
    """Adam (Kingma & Ba 2015) on the cuts of the widest weights a step's path used.

    :meth:`take` is the supernet's ``take``: it hands out a leaf copy of each cut and remembers
    where it came from; :meth:`step` updates the cut and its moments in place. Bias correction
    counts the steps each weight took part in.
    """

    def __init__(self, lr: float, *, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"SliceAdam: bad settings lr={lr!r}, betas={betas!r}, eps={eps!r}, "
                             f"weight_decay={weight_decay!r}")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # m, v, steps taken
        self.cuts: list[tuple[torch.Tensor, tuple[Index, ...], torch.Tensor]] = []

    def take(self, t: torch.Tensor, *index: Index) -> torch.Tensor:
        leaf = _read(t.detach(), index).requires_grad_()
        self.cuts.append((t, index, leaf))
        return leaf

    def zero_grad(self) -> None:
        self.cuts = []

    @torch.no_grad()
    def step(self) -> None:
        group: list[tuple[torch.Tensor, tuple[Index, ...], torch.Tensor]] = []
        for cut in self.cuts:
            if cut[2].grad is None:
                continue
            if any(cut[0] is other[0] for other in group):  # a weight cut twice: its steps one after the other
                self._update(group)
                group = []
            group.append(cut)
        self._update(group)
        self.cuts = []

    def _update(self, group: list[tuple[torch.Tensor, tuple[Index, ...], torch.Tensor]]) -> None:
        """One fused Adam step (torch's own kernel) on the cuts of ``group`` (distinct weights): the
        cuts and their moments are gathered, stepped in place, and written back."""
        if not group:
            return
        for t, _, _ in group:  # moments are allocated on a weight's first step, as in Adam
            if id(t) not in self.state:
                self.state[id(t)] = (torch.zeros_like(t), torch.zeros_like(t), torch.zeros((), dtype=torch.float32))
        states = [self.state[id(t)] for t, _, _ in group]
        leaves = [leaf.detach() for _, _, leaf in group]
        ms = [_read(m, index) for (_, index, _), (m, _, _) in zip(group, states)]
        vs = [_read(v, index) for (_, index, _), (_, v, _) in zip(group, states)]
        adam(leaves, [leaf.grad for _, _, leaf in group], ms, vs, [], [count for _, _, count in states],
             fused=True, amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=self.lr,
             weight_decay=self.weight_decay, eps=self.eps, maximize=False)
        for (t, index, _), leaf, m_cut, v_cut, (m, v, _) in zip(group, leaves, ms, vs, states):
            _write(m, index, m_cut)
            _write(v, index, v_cut)
            _write(t.data, index, leaf)


class SupernetTrainer:
    """Steps a supernet's weights on training batches, one path per step.

    Paths differ wildly in activation scale (stacks of unnormalized dot products, FMs and linear
    maps), and one path's exploding step would inflate the optimizer state of every weight it
    shares (Adam's and Adagrad's squared-gradient averages), freezing them for thousands of steps.
    So a step whose batch NE exceeds ``max_ne`` (or is not finite) is skipped, and gradients are
    clipped to a global norm of ``max_grad_norm``.

    Args:
        supernet: the model whose weights are trained.
        cfg: learning rates and weight decay (those of candidate training).
        ctr: the training click rate; ``ne`` divides the loss by its entropy, and the supernet's
            output layers start at its log-odds (:meth:`~rankitect.supernet.widest.SupernetHead.start_at`).
        max_ne: batch NE above which a path takes no step.
        max_grad_norm: global gradient norm a step is clipped to.
        patience: consecutive skipped steps after which training counts as diverged.
    """

    def __init__(self, supernet: Supernet, cfg: TrainConfig, ctr: float, *, max_ne: float = 10.0,
                 max_grad_norm: float = 1.0, patience: int = 50) -> None:
        self.supernet = supernet
        sparse, self.dense = split_parameters(supernet)
        self.sparse = sparse
        self.sparse_opt = RowWiseAdagrad(sparse, lr=cfg.lr_sparse)
        self.dense_opt = SliceAdam(cfg.lr_dense, weight_decay=cfg.weight_decay)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.base_entropy = entropy(ctr)
        if self.base_entropy <= 0:
            raise ValueError(f"the training click rate {ctr!r} has no entropy: NE is undefined")
        self.max_ne, self.max_grad_norm, self.patience = max_ne, max_grad_norm, patience
        self.steps, self.skipped, self._in_a_row = 0, 0, 0
        supernet.head.start_at(ctr)  # every path starts at the base rate, as every trained model does

    def step(self, batch: Batch, path: Path, *, gates: Mapping[str, torch.Tensor] | None = None,
             objective: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
        """One optimizer step on ``batch`` through ``path`` (none if it explodes); returns the loss.

        With ``gates`` and ``objective`` (DNAS on one forward) the backward pass is that of
        ``objective(loss)``: it leaves the architecture gradient on whatever the gates depend on,
        and the weights' gradients are scaled back to those of the loss (the objective is the loss
        times a factor that does not depend on the weights), so the weights train as without it.
        """
        self.sparse_opt.zero_grad(set_to_none=True)
        self.dense_opt.zero_grad()
        loss = self.loss_fn(self.supernet(batch, path, gates, take=self.dense_opt.take), batch.labels)
        value = float(loss.detach())
        self.steps += 1
        if not math.isfinite(value) or value > self.max_ne * self.base_entropy:
            self.skipped += 1
            self._in_a_row += 1
            if self._in_a_row >= self.patience:
                raise RuntimeError(f"supernet training diverged: {self.patience} paths in a row above "
                                   f"NE {self.max_ne} (last loss {value}) at step {self.steps}")
            self.dense_opt.zero_grad()
            return value
        self._in_a_row = 0
        target = objective(loss) if objective is not None else loss
        target.backward()
        if target is not loss:
            self._rescale(value / float(target.detach()))
        if self.steps == 1:
            dense = {id(p) for p in self.dense}
            stray = [n for n, p in self.supernet.named_parameters() if p.grad is not None and id(p) in dense]
            if stray:  # a weight used without being cut would never be updated
                raise RuntimeError(f"supernet weights used uncut: {stray[:5]}")
        self._clip([leaf.grad for _, _, leaf in self.dense_opt.cuts] + [p.grad for p in self.sparse])
        self.sparse_opt.step()
        self.dense_opt.step()
        return value

    @torch.no_grad()
    def _rescale(self, factor: float) -> None:
        for g in [leaf.grad for _, _, leaf in self.dense_opt.cuts] + [p.grad for p in self.sparse]:
            if g is not None:
                g.mul_(factor)

    @torch.no_grad()
    def _clip(self, grads: list[torch.Tensor | None]) -> None:
        """Scale ``grads`` (dense, or sparse embedding rows) down to a global norm of ``max_grad_norm``."""
        grads = [g for g in grads if g is not None]
        squares = [(g.coalesce().values() if g.is_sparse else g).square().sum() for g in grads]
        norm = float(torch.stack(squares).sum().sqrt()) if squares else 0.0
        if norm > self.max_grad_norm:
            for g in grads:
                g.mul_(self.max_grad_norm / norm)

    def ne(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Differentiable NE of a batch: its mean log loss over the entropy of the training rate."""
        return self.loss_fn(logits, labels) / self.base_entropy


@torch.no_grad()
def evaluate_path(supernet: Supernet, path: Path, batches: Iterable[Batch]) -> dict[str, float]:
    """NE, logloss, AUC and calibration of one path with the supernet's weights."""
    was_training = supernet.training
    supernet.eval()
    acc = MetricAccumulator()
    try:
        for batch in batches:
            acc.update(supernet(batch, path), batch.labels)
    finally:
        supernet.train(was_training)
    return {k: float(v) for k, v in acc.compute().items()}


class CurveLogger:
    """Metrics of a long loop logged to one MLflow run in batches, not one call each.

    Args:
        tracker: the search's :class:`~rankitect.track.Tracker`.
        run_id: the run the curves belong to.
        flush_every: buffered values before a write (MLflow takes at most 1000 per call).
    """

    def __init__(self, tracker: Any, run_id: str, flush_every: int = 500) -> None:
        self.tracker, self.run_id, self.flush_every = tracker, run_id, min(flush_every, 1000)
        self._buffer: list[tuple[str, float, int, int]] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self._buffer += [(k, float(v), now, step) for k, v in metrics.items() if math.isfinite(v)]
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        self.tracker.log_curve(self.run_id, self._buffer)
        self._buffer = []


def save_supernet(tracker: Any, run_id: str, supernet: Any, space: Any, spec: Any) -> None:
    """Keep a trained supernet on its run as ``supernet/``: its widest weights once, in safetensors
    (``weights.safetensors``), the space that shaped it (``space.json``) and the feature spec, so
    ``rankitect finetune --from-supernet`` can cut any candidate out of it later."""
    import json
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / SUPERNET_DIR
        folder.mkdir()
        state = {k: v.detach().contiguous() for k, v in supernet.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_FILE))
        (folder / "space.json").write_text(json.dumps(space.to_dict()))
        spec.save(folder / "feature_spec.json")
        tracker.log_artifacts(run_id, folder, SUPERNET_DIR)


def load_supernet(folder: Any) -> Any:
    """The supernet kept by :func:`save_supernet` in ``folder`` (a downloaded ``supernet/``)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from rankitect.data.spec import FeatureSpec
    from rankitect.space import get_space
    from rankitect.supernet.model import Supernet

    folder = Path(folder)
    space_d = json.loads((folder / "space.json").read_text())
    # A supernet saved before spaces had recipe choices had none: build its space without them.
    space = get_space(space_d["name"], **{"recipe": {}, **space_d["options"]})
    supernet = Supernet(space, FeatureSpec.load(folder / "feature_spec.json"))
    supernet.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    return supernet


SUPERNET_DIR = "supernet"
WEIGHTS_FILE = "weights.safetensors"

__all__ = ["CurveLogger", "SliceAdam", "SupernetTrainer", "batches", "build_supernet", "check_supernet_memory",
           "evaluate_path", "frozen", "load_supernet", "memory_budget", "save_supernet", "supernet_schedule"]
