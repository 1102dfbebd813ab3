import torch
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad as TorchrecRowWiseAdagrad

from rankitect.train.optim import RowWiseAdagrad


def _grads(seed: int, steps: int, rows: int = 50, dim: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, rows, (7,), generator=g)  # repeats included: a sparse grad sums them
        vals = torch.randn(7, dim, generator=g)
        out.append((ids, vals))
    return out


def _run(opt_cls, sparse: bool, grads, rows: int = 50, dim: int = 4) -> torch.Tensor:
    w = torch.nn.Parameter(torch.randn(rows, dim, generator=torch.Generator().manual_seed(0)))
    opt = opt_cls([w], lr=0.3)
    for ids, vals in grads:
        g = torch.sparse_coo_tensor(ids.unsqueeze(0), vals, (rows, dim))
        w.grad = g if sparse else g.to_dense()
        opt.step()
    return w.detach()


def test_dense_update_equals_torchrec() -> None:
    grads = _grads(1, 6)
    assert torch.allclose(_run(RowWiseAdagrad, False, grads), _run(TorchrecRowWiseAdagrad, False, grads), atol=1e-6)


def test_sparse_update_equals_dense_update() -> None:
    grads = _grads(2, 6)
    assert torch.allclose(_run(RowWiseAdagrad, True, grads), _run(TorchrecRowWiseAdagrad, False, grads), atol=1e-6)


def test_naive_row_update() -> None:
    w = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    opt = RowWiseAdagrad([w], lr=0.5, eps=0.0)
    w.grad = torch.sparse_coo_tensor([[1, 1]], [[1.0, 1.0], [2.0, 0.0]], (2, 2))  # row 1 twice: g = [3, 1]
    opt.step()
    s = (3.0**2 + 1.0**2) / 2
    assert torch.allclose(w.data, torch.tensor([[1.0, 2.0], [3 - 0.5 * 3 / s**0.5, 4 - 0.5 * 1 / s**0.5]]))
