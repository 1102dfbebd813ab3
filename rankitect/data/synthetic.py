"""The embedded default data set: seeded, Criteo-like click data with a planted teacher.

Shape of the data (all of it a function of ``seed``; ``rows`` only says how much to draw):

* 13 dense features ``I1..I13``: integer counts ``floor(exp(mu + sigma z))`` (log-normal), stored
  as ``log1p`` like the Criteo reader does; each is missing (stored 0) with a small probability.
* 26 sparse features ``C1..C26`` with vocabularies log-spaced from 10 to 100 000 ids; ids are drawn
  Zipf-like (``P(rank r) ~ r^-a``, ``a`` in [1.05, 1.3]) through a fixed permutation of the ids;
  id 0 means missing.
* Rows come in requests of 1..20 candidates (``1 + Binomial(19, 7/19)``, mean 8). ``I1..I4`` and
  ``C1..C8`` are request side (one draw per request, shared by its candidates); the rest are
  candidate side. Request side comes first in storage order.
* The click probability is ``sigmoid(logit)`` of a planted teacher::

    logit = bias + a1 * first order (a weight per id, summed over fields)
                 + a2 * dense linear
                 + a3 * sum over field pairs <v_i, v_j>  (FM-like, 4-dim, incl. request x candidate)
                 + a4 * dense . (W dense)                (cross-like)
                 + a5 * sum over field triples sum_d u_i,d u_j,d u_k,d   (third order)
                 + a6 * a random 13-16-1 tanh MLP on the dense features

  Per-id weights are N(0, 1) shrunk by ``min(1, 50 / rank)`` in the Zipf tail, so the signal
  sits mostly on ids seen often enough to learn. Each term is standardized on a calibration
  sample, the weights ``a`` put the logit's spread where the Bayes NE is about 0.8, and ``bias``
  is solved so the mean CTR is 0.25 (``ctr``: another click rate, e.g. ``0.0064`` for a
  rare-click ad log; the same teacher, shifted).
  Labels are Bernoulli draws; ``probs`` are stored, so every split knows its Bayes NE.

Determinism: teacher parameters come from ``default_rng([seed, 0])`` alone; request sizes and
features are drawn per block of 1024 requests from ``[seed, 3, block]`` / ``[seed, 1, block]``, so
the rows do not depend on ``chunk_rows`` and a larger ``rows`` extends a smaller one.
Memory is bounded by ``chunk_rows`` (plus the teacher, ~30 MB), not by ``rows``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from rankitect.data.hashing import DEFAULT_FRACTIONS, SPLITS, check_fractions, request_splits
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.data.clickdata import ClickData
from rankitect.data.store import StoreWriter, cached, data_cache_root

GENERATOR_VERSION = 2  # part of every cache key: bump when the distribution changes
DEFAULT_ROWS = 200_000  # one epoch of the default trial budget (300 steps x 512 rows, 80% train)
N_DENSE, N_SPARSE = 13, 26
N_REQUEST_DENSE, N_REQUEST_SPARSE = 4, 8
BLOCK_REQUESTS = 1024
TARGET_CTR = 0.25
TAIL_RANK = 50
# Weights of the standardized teacher terms: first order, dense linear, FM, cross, third, MLP.
TERM_WEIGHTS = np.array([0.72, 0.4, 0.72, 0.36, 0.48, 0.44])  # Bayes NE ~0.80 (0.795-0.81 over seeds)
_CALIBRATION_ROWS = 32_768


@dataclass
class _Rows:
    """Features of a run of rows before labelling: dense (n, 13), ids (n, 26), uniforms (n,), and a
    generator's history, right-aligned ids (n, max_len) and lengths (n,), when it draws one."""

    dense: np.ndarray
    ids: np.ndarray
    request_ids: np.ndarray
    label_u: np.ndarray
    history: np.ndarray | None = None
    history_len: np.ndarray | None = None

    def head(self, n: int) -> _Rows:
        """The first ``n`` rows."""
        return _Rows(*(None if v is None else v[:n] for v in self._values()))

    def _values(self) -> list[np.ndarray | None]:
        return [self.dense, self.ids, self.request_ids, self.label_u, self.history, self.history_len]


class Teacher:
    """The planted click model and the feature distributions, all drawn from ``seed``."""

    def __init__(self, seed: int, ctr: float = TARGET_CTR) -> None:
        rng = np.random.default_rng([seed, 0])
        self.vocab = rng.permutation(np.geomspace(10, 100_000, N_SPARSE).round().astype(np.int64))
        self.zipf_a = rng.uniform(1.05, 1.3, N_SPARSE)
        self.sparse_missing = rng.uniform(0.0, 0.08, N_SPARSE) * (rng.random(N_SPARSE) < 0.5)
        self.dense_mu, self.dense_sigma = rng.uniform(0.0, 4.0, N_DENSE), rng.uniform(0.5, 1.5, N_DENSE)
        self.dense_missing = rng.uniform(0.0, 0.2, N_DENSE) * (rng.random(N_DENSE) < 0.5)
        self.cdf = [np.cumsum(np.arange(1, v, dtype=np.float64) ** -a) for v, a in zip(self.vocab, self.zipf_a)]
        self.cdf = [c / c[-1] for c in self.cdf]
        self.id_of_rank = [rng.permutation(np.arange(1, v)) for v in self.vocab]
        self.w1 = [self._id_table(rng, f, 1)[:, 0] for f in range(N_SPARSE)]
        self.v2 = [self._id_table(rng, f, 4) for f in range(N_SPARSE)]
        self.v3 = [self._id_table(rng, f, 2) for f in range(N_SPARSE)]
        self.pairs = _field_pairs(rng)
        self.triples = [tuple(sorted(rng.choice(N_SPARSE, 3, replace=False))) for _ in range(5)]
        self.u = rng.standard_normal(N_DENSE)
        self.W = rng.standard_normal((N_DENSE, N_DENSE)) / np.sqrt(N_DENSE)
        self.c = rng.standard_normal(N_DENSE)
        self.W1, self.b1 = rng.standard_normal((N_DENSE, 16)) / np.sqrt(N_DENSE), rng.standard_normal(16) * 0.5
        self.w2 = rng.standard_normal(16)
        cal = self.draw_block(np.random.default_rng([seed, 2]), _calibration_sizes(seed), 0)
        self.dense_mean, self.dense_std = cal.dense.mean(0), cal.dense.std(0) + 1e-6
        terms = self.terms(cal.dense, cal.ids)  # (6, n)
        self.term_scale = TERM_WEIGHTS / (terms.std(axis=1) + 1e-12)
        self.bias = 0.0
        self.bias = _solve_bias(self.logit(cal.dense, cal.ids), check_ctr(ctr))

    def _id_table(self, rng: np.random.Generator, f: int, dim: int) -> np.ndarray:
        """Per-id teacher weights ``(vocab, dim)``: N(0, 1) shrunk in the tail by ``min(1, 50 / rank)``.

        Rare ids matter less (as in real logs, where a model could never learn them anyway), so
        most of the signal sits on ids a model sees often enough to learn.
        """
        v = int(self.vocab[f])
        table = np.zeros((v, dim))
        shrink = np.minimum(1.0, (np.arange(1, v) / TAIL_RANK) ** -1.0)  # by rank 1 .. v - 1
        table[self.id_of_rank[f]] = rng.standard_normal((v - 1, dim)) * shrink[:, None]
        return table  # row 0 ("missing") stays 0: it carries no signal

    def spec(self) -> FeatureSpec:
        side = lambda i, n_req: "request" if i < n_req else "candidate"  # noqa: E731
        return FeatureSpec(
            dense=tuple(DenseFeature(f"I{i + 1}", side(i, N_REQUEST_DENSE)) for i in range(N_DENSE)),
            sparse=tuple(SparseFeature(f"C{i + 1}", int(v), side(i, N_REQUEST_SPARSE))
                         for i, v in enumerate(self.vocab)),
            name="synthetic",
        )

    def draw_block(self, rng: np.random.Generator, sizes: np.ndarray, first_request: int) -> _Rows:
        """Features of requests with ``sizes`` candidates each; request side drawn once per request."""
        n_req, n = len(sizes), int(sizes.sum())
        dense = np.empty((n, N_DENSE), np.float32)
        ids = np.empty((n, N_SPARSE), np.int64)
        dense[:, :N_REQUEST_DENSE] = np.repeat(self._dense(rng, n_req, slice(0, N_REQUEST_DENSE)), sizes, axis=0)
        dense[:, N_REQUEST_DENSE:] = self._dense(rng, n, slice(N_REQUEST_DENSE, None))
        for f in range(N_SPARSE):
            m = n_req if f < N_REQUEST_SPARSE else n
            col = self._ids(rng, f, m)
            ids[:, f] = np.repeat(col, sizes) if f < N_REQUEST_SPARSE else col
        request_ids = np.repeat(np.arange(first_request, first_request + n_req, dtype=np.int64), sizes)
        return _Rows(dense, ids, request_ids, rng.random(n))

    def _dense(self, rng: np.random.Generator, n: int, cols: slice) -> np.ndarray:
        mu, sigma, miss = self.dense_mu[cols], self.dense_sigma[cols], self.dense_missing[cols]
        counts = np.floor(np.exp(mu + sigma * rng.standard_normal((n, len(mu)))))
        return np.where(rng.random((n, len(mu))) < miss, 0.0, np.log1p(counts))

    def _ids(self, rng: np.random.Generator, f: int, n: int) -> np.ndarray:
        rank = np.searchsorted(self.cdf[f], rng.random(n), side="right").clip(max=len(self.cdf[f]) - 1)
        return np.where(rng.random(n) < self.sparse_missing[f], 0, self.id_of_rank[f][rank])

    def terms(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The six raw teacher terms, ``(6, n)`` (see the module docstring)."""
        x = (dense - self.dense_mean) / self.dense_std  # standardized dense (n, 13)
        cols = range(N_SPARSE)
        first = sum(self.w1[f][ids[:, f]] for f in cols)
        fm = sum((self.v2[i][ids[:, i]] * self.v2[j][ids[:, j]]).sum(1) for i, j in self.pairs)
        third = sum((self.v3[i][ids[:, i]] * self.v3[j][ids[:, j]] * self.v3[k][ids[:, k]]).sum(1)
                    for i, j, k in self.triples)
        cross = ((x @ self.W.T) * x) @ self.c  # (n, 13) @ (13, 13) -> (n, 13), then ⊙ x, @ c -> (n,)
        mlp = np.tanh(x @ self.W1 + self.b1) @ self.w2  # (n, 13) @ (13, 16) -> (n, 16) @ (16,) -> (n,)
        return np.stack([first, x @ self.u, fm, cross, third, mlp])

    def logit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return self.bias + self.term_scale @ self.terms(dense, ids)  # (6,) @ (6, n) -> (n,)

    def probs(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit(dense, ids)))


def _field_pairs(rng: np.random.Generator) -> list[tuple[int, int]]:
    """12 request x candidate, 8 candidate x candidate and 4 request x request field pairs."""
    req, cand = np.arange(N_REQUEST_SPARSE), np.arange(N_REQUEST_SPARSE, N_SPARSE)
    pairs = {(int(rng.choice(req)), int(rng.choice(cand))) for _ in range(12)}
    pairs |= {tuple(sorted(int(x) for x in rng.choice(cand, 2, replace=False))) for _ in range(8)}
    pairs |= {tuple(sorted(int(x) for x in rng.choice(req, 2, replace=False))) for _ in range(4)}
    return sorted(pairs)


def _calibration_sizes(seed: int) -> np.ndarray:
    sizes = _request_sizes(np.random.default_rng([seed, 4]), _CALIBRATION_ROWS // 8 + 64)
    return sizes[: np.searchsorted(np.cumsum(sizes), _CALIBRATION_ROWS) + 1]


def _solve_bias(logit: np.ndarray, target: float) -> float:
    """Bias ``b`` with ``mean(sigmoid(logit + b)) == target`` (bisection; the mean is monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def check_ctr(ctr: Any) -> float:
    """A generator's click rate: a number strictly between 0 and 1.

    >>> check_ctr(0.0064)
    0.0064
    """
    if isinstance(ctr, bool) or not isinstance(ctr, (int, float)) or not 0.0 < ctr < 1.0:
        raise ValueError(f"ctr must be a click rate strictly between 0 and 1, got {ctr!r}")
    return float(ctr)


def ctr_key(ctr: float, default: float) -> str:
    """The cache key's part for a click rate: empty at the generator's ``default`` (keys of data
    sets written before the option existed stay as they were).

    >>> ctr_key(0.25, 0.25), ctr_key(0.0064, 0.25)
    ('', '-c0.0064')
    """
    return "" if ctr == default else f"-c{ctr:g}"


def _request_sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    return 1 + rng.binomial(19, 7 / 19, size=n)  # 1..20 candidates, mean 8


def request_blocks(rows: int, seed: int) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """``(block, first request id, full sizes, kept sizes)`` per block of requests.

    The kept sizes sum to ``rows`` over all blocks (the last block keeps a prefix of its requests,
    the last of them possibly cut short); features are always drawn for the full block and then
    cut, so a block's rows do not depend on ``rows``.
    """
    left, block = rows, 0
    while left > 0:
        full = _request_sizes(np.random.default_rng([seed, 3, block]), BLOCK_REQUESTS)
        sizes = full
        csum = np.cumsum(full)
        if csum[-1] >= left:
            k = int(np.searchsorted(csum, left))  # the request that reaches `left` is cut short
            sizes = full[: k + 1].copy()
            sizes[-1] -= int(csum[k] - left)
        left -= int(sizes.sum())
        yield block, block * BLOCK_REQUESTS, full, sizes
        block += 1


def _split_rows(rows: int, seed: int, fractions: Sequence[float]) -> dict[str, int]:
    counts = np.zeros(3, np.int64)
    for _, first, _, sizes in request_blocks(rows, seed):
        codes = request_splits(np.arange(first, first + len(sizes)), fractions, seed)
        counts += np.bincount(codes, weights=sizes, minlength=3).astype(np.int64)
    return dict(zip(SPLITS, counts.tolist()))


def generate_synthetic(
    out_dir: str | Path, *, rows: int = DEFAULT_ROWS, seed: int = 0, chunk_rows: int = 65536,
    progress: bool = False, fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR,
) -> ClickData:
    """Generate the synthetic data set into ``out_dir`` (replacing one there) and open it.

    Splits are by request (hash of the request id, ``fractions`` train/val/test); ``ctr`` is the
    mean click rate the teacher's bias is solved for.
    """
    fractions = check_generation(rows, chunk_rows, fractions)
    teacher = Teacher(seed, ctr)
    params = _params(rows, seed, fractions, ctr)
    meta = {"source": "synthetic", "name": "synthetic", "params": params, "cache_key": _cache_key(params),
            "teacher": {"target_ctr": ctr, "term_weights": TERM_WEIGHTS.tolist(), "bias": teacher.bias,
                        "pairs": teacher.pairs, "triples": [list(map(int, t)) for t in teacher.triples]}}
    return write_teacher_rows(out_dir, teacher, meta, lambda c: teacher.probs(c.dense, c.ids), rows=rows, seed=seed,
                              fractions=fractions, chunk_rows=chunk_rows, progress=progress, stream=1)


def check_generation(rows: Any, chunk_rows: int, fractions: Sequence[float]) -> tuple[float, ...]:
    """A generator's arguments checked: ``rows`` and ``chunk_rows`` positive ints; the fractions."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows!r}")
    return check_fractions(fractions)


def write_teacher_rows(
    out_dir: str | Path, teacher: Any, meta: dict, probs: Callable[[_Rows], np.ndarray], *, rows: int, seed: int,
    fractions: Sequence[float], chunk_rows: int, progress: bool, stream: int,
) -> ClickData:
    """Draw ``rows`` rows from ``teacher`` (its ``draw_block(rng, sizes, first_request)``), label
    each with a coin of probability ``probs(chunk)``, route whole requests to their split and write
    the store, true probabilities included; ``stream`` keeps generators' random draws apart."""
    name, spec = meta["name"], teacher.spec()
    with StoreWriter(out_dir, spec, _split_rows(rows, seed, fractions), with_probs=True) as w, \
            tqdm(total=rows, unit="row", disable=not progress, desc=name) as bar:
        for chunk in _chunks(teacher, rows, seed, chunk_rows, stream):
            p = probs(chunk)
            labels = (chunk.label_u < p).astype(np.float32)
            codes = request_splits(chunk.request_ids, fractions, seed)
            history = {spec.sequence[0].name: (chunk.history, chunk.history_len)} if chunk.history is not None else None
            w.write_routed(codes, chunk.dense, chunk.ids, labels, chunk.request_ids, p.astype(np.float32), history)
            bar.update(len(labels))
        return w.close(meta)


def _chunks(teacher: Any, rows: int, seed: int, chunk_rows: int, stream: int) -> Iterator[_Rows]:
    """Blocks of requests concatenated until a chunk holds at least ``chunk_rows`` rows."""
    parts: list[_Rows] = []
    for block, first, full, sizes in request_blocks(rows, seed):
        rows_of_block = teacher.draw_block(np.random.default_rng([seed, stream, block]), full, first)
        parts.append(rows_of_block.head(int(sizes.sum())))
        if sum(len(p.label_u) for p in parts) >= chunk_rows:
            yield _concat(parts)
            parts = []
    if parts:
        yield _concat(parts)


def _concat(parts: list[_Rows]) -> _Rows:
    columns = zip(*(p._values() for p in parts))
    return _Rows(*(None if c[0] is None else np.concatenate(c) for c in columns))


def _params(rows: int, seed: int, fractions: Sequence[float], ctr: float) -> dict:
    params = {"rows": rows, "seed": seed, "fractions": list(check_fractions(fractions)),
              "generator_version": GENERATOR_VERSION}
    return params if ctr == TARGET_CTR else {**params, "ctr": check_ctr(ctr)}


def _cache_key(params: dict) -> str:
    fr = "-".join(f"{f:g}" for f in params["fractions"])
    ctr = ctr_key(params.get("ctr", TARGET_CTR), TARGET_CTR)
    return f"synthetic-v{params['generator_version']}-r{params['rows']}-s{params['seed']}-f{fr}{ctr}"


def default_data_dir(
    *, rows: int = DEFAULT_ROWS, seed: int = 0, cache_dir: str | Path | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR,
) -> Path:
    """Where :func:`ensure_default_data` keeps the synthetic set of these parameters (no I/O)."""
    return data_cache_root(cache_dir) / _cache_key(_params(rows, seed, fractions, ctr))


def ensure_default_data(
    *, rows: int = DEFAULT_ROWS, seed: int = 0, cache_dir: str | Path | None = None, progress: bool = False,
    fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR,
) -> ClickData:
    """The synthetic data set of these parameters, generated into the cache once and reused after."""
    out = default_data_dir(rows=rows, seed=seed, cache_dir=cache_dir, fractions=fractions, ctr=ctr)
    out.parent.mkdir(parents=True, exist_ok=True)
    return cached(out, out.name, lambda d: generate_synthetic(d, rows=rows, seed=seed, progress=progress,
                                                             fractions=fractions, ctr=ctr))
