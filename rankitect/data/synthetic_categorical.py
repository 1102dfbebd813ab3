"""An all-categorical synthetic click log: Zipf users and items, a planted teacher, known Bayes NE.

The usual click log has no dense features: who (user id and its attributes), where (device, hour)
and what (item id and its attributes). This generator draws such a log, seeded, with the true
click probability of every row, so each split knows the floor no model beats (its Bayes NE).

Shape of the data (all of it a function of ``seed``; ``rows`` only says how much to draw):

* Requests of 1..20 candidates, as the default synthetic set (``1 + Binomial(19, 7/19)``).
* Request side, one draw per request: ``user_id`` (Zipf over :data:`USERS` ids, exponent
  :data:`USER_ZIPF`), its attributes ``user_age``, ``user_gender``, ``user_region`` (fixed
  functions of the user id, as a profile is), and the context ``device`` and ``hour``.
* Candidate side, one draw per row: ``item_id`` (Zipf over :data:`ITEMS` ids, exponent
  :data:`ITEM_ZIPF`) and its attributes ``item_category``, ``item_brand``, ``item_price``
  (a brand belongs to one category).
* Ids reach ranks through a fixed permutation (``P(rank r) ~ r^-a``); id 0 means missing.
* No dense features at all (``spec.n_dense == 0``).
* The click probability is ``sigmoid(logit)`` of a planted teacher::

    logit = bias + a1 * sum over fields of w_f[id]                (first order)
                 + a2 * <U[user_id], V[item_id]>                  (user-by-item factors, 8-dim)
                 + a3 * sum over ATTRIBUTE_PAIRS <P[a], Q[b]>     (field-pair factors, 4-dim)
                 + a4 * sum over CROSSES T[a, b (, c)]           (sparse crosses: few cells set)

  User and item weights are N(0, 1) shrunk by ``min(1, TAIL_RANK / rank)`` in the Zipf tail, so the
  signal sits mostly on ids seen often enough to learn. A cross table holds N(0, 1) in a
  :data:`CROSS_DENSITY` fraction of its cells and 0 elsewhere. Each term is standardized on a
  calibration sample, the weights ``a`` set the logit's spread, and ``bias`` is solved for the
  mean CTR :data:`TARGET_CTR`. Labels are Bernoulli draws; ``probs`` are stored.
* ``history`` (``data.history``, 0 = none): each request also gets a history of up to ``history``
  earlier items (``item_history``, sharing ``item_id``'s vocabulary), drawn from a per-request
  session interest that no other feature carries, and the teacher a fifth term, the overlap of
  the candidate with that history (:mod:`rankitect.data.synthetic_history`). Without it the log
  is exactly the one written before the option existed.

Determinism: the teacher comes from ``default_rng([seed, 10])``; request sizes are those of the
default synthetic set (``[seed, 3, block]``) and features are drawn per block of requests from
``[seed, 11, block]``, so a larger ``rows`` extends a smaller one and ``chunk_rows`` changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rankitect.data.hashing import DEFAULT_FRACTIONS, check_fractions
from rankitect.data.spec import FeatureSpec, SequenceFeature, SparseFeature
from rankitect.data.clickdata import ClickData
from rankitect.data.store import cached, data_cache_root
from rankitect.data.synthetic import (
    _calibration_sizes, _Rows, _solve_bias, check_ctr, check_generation, ctr_key, write_teacher_rows,
)
from rankitect.data.synthetic_history import HISTORY_WEIGHT, SessionHistory

SOURCE = "synthetic-categorical"
GENERATOR_VERSION = 1  # part of every cache key: bump when the distribution changes
DEFAULT_ROWS = 100_000
USERS, ITEMS = 20_000, 5_000
USER_ZIPF, ITEM_ZIPF = 1.05, 1.1
TAIL_RANK = 100
# (name, side, vocabulary without the missing id 0); request side first, as stored.
FIELDS: tuple[tuple[str, str, int], ...] = (
    ("user_id", "request", USERS), ("user_age", "request", 8), ("user_gender", "request", 3),
    ("user_region", "request", 64), ("device", "request", 6), ("hour", "request", 24),
    ("item_id", "candidate", ITEMS), ("item_category", "candidate", 40), ("item_brand", "candidate", 800),
    ("item_price", "candidate", 10),
)
USER, AGE, GENDER, REGION, DEVICE, HOUR, ITEM, CATEGORY, BRAND, PRICE = range(len(FIELDS))
FACTOR_DIM, PAIR_DIM = 8, 4
ATTRIBUTE_PAIRS = ((AGE, CATEGORY), (REGION, BRAND), (GENDER, PRICE), (USER, CATEGORY), (ITEM, REGION))
CROSSES = ((DEVICE, CATEGORY), (HOUR, CATEGORY), (AGE, PRICE), (AGE, HOUR, CATEGORY))
CROSS_DENSITY = 0.2
TARGET_CTR = 0.15
# Weights of the standardized teacher terms: first order, user x item, attribute pairs, crosses.
TERM_WEIGHTS = np.array([0.8, 0.7, 0.6, 0.6])
_CALIBRATION_ROWS = 32_768
HISTORY_NAME = "item_history"


class CategoricalTeacher:
    """The planted click model and the feature distributions, all drawn from ``seed``.

    Attributes a reader may recompute the logit from (see the module docstring): ``first[f]``
    (per-id weights of field ``f``, ``(vocab,)``), ``user_factors`` ``(USERS + 1, 8)``,
    ``item_factors`` ``(ITEMS + 1, 8)``, ``pair_factors[k]`` (two tables ``(vocab, 4)`` for
    ``ATTRIBUTE_PAIRS[k]``), ``crosses[k]`` (a table indexed by the ids of ``CROSSES[k]``),
    ``term_scale`` ``(4,)`` (``(5,)`` with a history) and ``bias``.
    """

    def __init__(self, seed: int, ctr: float = TARGET_CTR, history: int = 0) -> None:
        rng = np.random.default_rng([seed, 10])
        self.vocab = np.array([n + 1 for _, _, n in FIELDS])
        self.user_cdf, self.item_cdf = _zipf_cdf(USERS, USER_ZIPF), _zipf_cdf(ITEMS, ITEM_ZIPF)
        self.user_of_rank, self.item_of_rank = 1 + rng.permutation(USERS), 1 + rng.permutation(ITEMS)
        self.profile = {f: _attribute(rng, USERS, FIELDS[f][2]) for f in (AGE, GENDER, REGION)}  # by user id
        brand = _attribute(rng, ITEMS, FIELDS[BRAND][2])
        category_of_brand = _attribute(rng, FIELDS[BRAND][2], FIELDS[CATEGORY][2])
        price = _attribute(rng, ITEMS, FIELDS[PRICE][2])
        self.catalog = {BRAND: brand, CATEGORY: category_of_brand[brand], PRICE: price}  # by item id
        self.context = {f: rng.dirichlet(np.ones(FIELDS[f][2])) for f in (DEVICE, HOUR)}  # probabilities of ids 1..
        self.first = [self._table(rng, f, 1)[:, 0] for f in range(len(FIELDS))]
        self.user_factors, self.item_factors = self._table(rng, USER, FACTOR_DIM), self._table(rng, ITEM, FACTOR_DIM)
        self.pair_factors = [(self._table(rng, a, PAIR_DIM), self._table(rng, b, PAIR_DIM)) for a, b in ATTRIBUTE_PAIRS]
        self.crosses = [_sparse_cross(rng, tuple(int(self.vocab[f]) for f in fields)) for fields in CROSSES]
        self.session = (SessionHistory(check_history(history), self.catalog[CATEGORY], self.item_cdf, self.item_of_rank)
                        if history else None)
        cal = self.draw_block(np.random.default_rng([seed, 12]), _calibration_sizes(seed), 0)
        terms = self.terms(cal)  # (4, n), (5, n) with a history
        weights = TERM_WEIGHTS if self.session is None else np.append(TERM_WEIGHTS, HISTORY_WEIGHT)
        self.term_scale = weights / (terms.std(axis=1) + 1e-12)
        self.bias = 0.0
        self.bias = _solve_bias(self.logit(cal), check_ctr(ctr))

    def _table(self, rng: np.random.Generator, f: int, dim: int) -> np.ndarray:
        """Per-id weights ``(vocab, dim)``, N(0, 1); user and item ids shrunk by ``min(1, TAIL_RANK / rank)``.

        Rare users and items matter less (a model could never learn them anyway), so most of the
        signal sits on ids a model sees often enough to learn. Row 0 ("missing") stays 0.
        """
        n = FIELDS[f][2]
        table = np.zeros((n + 1, dim))
        of_rank = {USER: self.user_of_rank, ITEM: self.item_of_rank}.get(f)
        if of_rank is None:
            table[1:] = rng.standard_normal((n, dim))
        else:
            shrink = np.minimum(1.0, TAIL_RANK / np.arange(1, n + 1))  # by rank 1 .. n
            table[of_rank] = rng.standard_normal((n, dim)) * shrink[:, None]
        return table

    def spec(self) -> FeatureSpec:
        sequence = () if self.session is None else (
            SequenceFeature(HISTORY_NAME, self.session.max_len, ITEMS + 1, shares=FIELDS[ITEM][0]),)
        return FeatureSpec(dense=(), sparse=tuple(SparseFeature(name, n + 1, side) for name, side, n in FIELDS),
                           name=SOURCE, sequence=sequence)

    def draw_block(self, rng: np.random.Generator, sizes: np.ndarray, first_request: int) -> _Rows:
        """Features of requests with ``sizes`` candidates each; request side drawn once per request."""
        n_req, n = len(sizes), int(sizes.sum())
        per_request = np.zeros((n_req, HOUR + 1), np.int64)  # (requests, request-side fields)
        users = self.user_of_rank[_ranks(rng, self.user_cdf, n_req)]
        per_request[:, USER] = users
        for f, table in self.profile.items():
            per_request[:, f] = table[users]
        for f, p in self.context.items():
            per_request[:, f] = 1 + rng.choice(len(p), size=n_req, p=p)
        ids = np.empty((n, len(FIELDS)), np.int64)
        ids[:, :HOUR + 1] = np.repeat(per_request, sizes, axis=0)
        items = self.item_of_rank[_ranks(rng, self.item_cdf, n)]
        ids[:, ITEM] = items
        for f, table in self.catalog.items():
            ids[:, f] = table[items]
        request_ids = np.repeat(np.arange(first_request, first_request + n_req, dtype=np.int64), sizes)
        rows = _Rows(np.zeros((n, 0), np.float32), ids, request_ids, rng.random(n))
        if self.session is not None:  # drawn after everything else: without a history the draws are the old ones
            rows.history, rows.history_len, items = self.session.draw(rng, sizes, ids[:, ITEM])
            ids[:, ITEM] = items
            for f, table in self.catalog.items():
                ids[:, f] = table[items]
        return rows

    def terms(self, rows: _Rows) -> np.ndarray:
        """The raw teacher terms of ``rows`` (see the module docstring): ``(4, n)`` from the ids
        ``(n, fields)``, plus the history's overlap with the candidate, ``(5, n)``, with a history."""
        ids = rows.ids
        first = sum(self.first[f][ids[:, f]] for f in range(len(FIELDS)))
        factors = (self.user_factors[ids[:, USER]] * self.item_factors[ids[:, ITEM]]).sum(1)
        pairs = sum((p[ids[:, a]] * q[ids[:, b]]).sum(1) for (a, b), (p, q) in zip(ATTRIBUTE_PAIRS, self.pair_factors))
        crosses = sum(table[tuple(ids[:, f] for f in fields)] for fields, table in zip(CROSSES, self.crosses))
        if self.session is None:
            return np.stack([first, factors, pairs, crosses])
        overlap = self.session.overlap(ids[:, ITEM], rows.history, rows.history_len)
        return np.stack([first, factors, pairs, crosses, overlap])

    def logit(self, rows: _Rows) -> np.ndarray:
        return self.bias + self.term_scale @ self.terms(rows)  # (4,) @ (4, n) -> (n,) (5 terms with a history)

    def probs(self, rows: _Rows) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit(rows)))


def _zipf_cdf(n: int, a: float) -> np.ndarray:
    """Cumulative ``P(rank <= r)`` for ranks 1..n with ``P(rank r) ~ r^-a``."""
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -a)
    return cdf / cdf[-1]


def _ranks(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    """``n`` ranks (0-based) drawn from ``cdf``."""
    return np.searchsorted(cdf, rng.random(n), side="right").clip(max=len(cdf) - 1)


def _attribute(rng: np.random.Generator, n: int, values: int) -> np.ndarray:
    """A fixed attribute per id ``0..n`` (``(n + 1,)``, values in ``1..values``; id 0 maps to 0)."""
    return np.concatenate([[0], 1 + rng.integers(0, values, n)])


def _sparse_cross(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A cross table over the ids of some fields: N(0, 1) in a ``CROSS_DENSITY`` fraction of cells."""
    return rng.standard_normal(shape) * (rng.random(shape) < CROSS_DENSITY)


def check_history(history: object) -> int:
    """A history length: an int >= 0 (0: no history).

    >>> check_history(20)
    20
    """
    if isinstance(history, bool) or not isinstance(history, int) or history < 0:
        raise ValueError(f"history must be an int >= 0 (the longest history; 0: none), got {history!r}")
    return history


def generate_categorical(
    out_dir: str | Path, *, rows: int = DEFAULT_ROWS, seed: int = 0, chunk_rows: int = 65536,
    progress: bool = False, fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR,
    history: int = 0,
) -> ClickData:
    """Generate the all-categorical set into ``out_dir`` (replacing one there) and open it.

    Splits are by request (hash of the request id, ``fractions`` train/val/test); ``ctr`` is the
    mean click rate the teacher's bias is solved for; ``history`` the longest history (0: none).
    """
    fractions = check_generation(rows, chunk_rows, fractions)
    teacher = CategoricalTeacher(seed, ctr, check_history(history))
    params = _params(rows, seed, fractions, ctr, history)
    weights = TERM_WEIGHTS.tolist() + ([HISTORY_WEIGHT] if history else [])
    meta = {"source": SOURCE, "name": SOURCE, "params": params, "cache_key": _cache_key(params),
            "teacher": {"target_ctr": ctr, "term_weights": weights, "bias": teacher.bias,
                        "attribute_pairs": [list(p) for p in ATTRIBUTE_PAIRS], "crosses": [list(c) for c in CROSSES]}}
    return write_teacher_rows(out_dir, teacher, meta, teacher.probs, rows=rows, seed=seed,
                              fractions=fractions, chunk_rows=chunk_rows, progress=progress, stream=11)


def _params(rows: int, seed: int, fractions: Sequence[float], ctr: float = TARGET_CTR, history: int = 0) -> dict:
    params = {"rows": rows, "seed": seed, "fractions": list(check_fractions(fractions)),
              "generator_version": GENERATOR_VERSION}
    if ctr != TARGET_CTR:
        params["ctr"] = check_ctr(ctr)
    if check_history(history):  # only when set: the parameters (and keys) of older sets stay as they were
        params["history"] = history
    return params


def _cache_key(params: dict) -> str:
    fr = "-".join(f"{f:g}" for f in params["fractions"])
    ctr = ctr_key(params.get("ctr", TARGET_CTR), TARGET_CTR)
    history = f"-h{params['history']}" if params.get("history") else ""
    return f"{SOURCE}-v{params['generator_version']}-r{params['rows']}-s{params['seed']}-f{fr}{ctr}{history}"


def categorical_data_dir(
    *, rows: int = DEFAULT_ROWS, seed: int = 0, cache_dir: str | Path | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR, history: int = 0,
) -> Path:
    """Where :func:`ensure_categorical_data` keeps the set of these parameters (no I/O)."""
    return data_cache_root(cache_dir) / _cache_key(_params(rows, seed, fractions, ctr, history))


def ensure_categorical_data(
    *, rows: int = DEFAULT_ROWS, seed: int = 0, cache_dir: str | Path | None = None, progress: bool = False,
    fractions: Sequence[float] = DEFAULT_FRACTIONS, ctr: float = TARGET_CTR, history: int = 0,
) -> ClickData:
    """The all-categorical set of these parameters, generated into the cache once and reused after."""
    out = categorical_data_dir(rows=rows, seed=seed, cache_dir=cache_dir, fractions=fractions, ctr=ctr,
                               history=history)
    return cached(out, out.name, lambda d: generate_categorical(d, rows=rows, seed=seed, progress=progress,
                                                                fractions=fractions, ctr=ctr, history=history))
