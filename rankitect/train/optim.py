"""Row-wise Adagrad for embedding tables, with sparse gradients.

The update of torchrec's ``RowWiseAdagrad`` (and of fbgemm's ``EXACT_ROWWISE_ADAGRAD`` that
sharded tables use): one accumulator per row, ``s_r += mean_d(g_rd^2)``,
``w_r -= lr * g_r / (sqrt(s_r) + eps)``. torchrec's version refuses sparse gradients, so every
step walks every row of every table; here a sparse gradient updates only the rows a batch looked
up. Rows without a gradient are untouched either way (their update is 0), so the two agree
exactly; only weight decay, which this optimizer does not offer, would tell them apart.

>>> w = torch.nn.Parameter(torch.ones(4, 2))
>>> opt = RowWiseAdagrad([w], lr=0.1)
>>> w.grad = torch.sparse_coo_tensor([[1]], [[2.0, 0.0]], (4, 2))
>>> opt.step()
>>> [round(v, 4) for v in w.data[1].tolist()], w.data[0].tolist()  # 1 - 0.1 * [2, 0] / sqrt(mean(4, 0))
([0.8586, 1.0], [1.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D parameters (embedding tables); dense or sparse gradients.

    Args:
        params: the tables, each ``(rows, dim)``.
        lr: learning rate.
        eps: added to the root of the accumulator.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 0.01, eps: float = 1e-10) -> None:
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        super().__init__(params, {"lr": lr, "eps": eps})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"row-wise Adagrad needs 2-D tables, got a parameter of shape {tuple(p.shape)}")
                self.state[p]["sum"] = torch.zeros(p.shape[0], 1, dtype=p.dtype, device=p.device)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                acc = self.state[p]["sum"]  # (rows, 1)
                if p.grad.is_sparse:
                    g = p.grad.coalesce()
                    rows, values = g.indices()[0], g.values()  # (n,), (n, dim): each row once
                    acc[rows] += values.pow(2).mean(dim=1, keepdim=True)
                    p.index_add_(0, rows, values / (acc[rows].sqrt() + eps), alpha=-lr)
                else:
                    acc += p.grad.pow(2).mean(dim=1, keepdim=True)
                    p.addcdiv_(p.grad, acc.sqrt().add(eps), value=-lr)
