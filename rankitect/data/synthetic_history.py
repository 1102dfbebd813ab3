"""The planted history signal of the all-categorical log (``data.history``, ``synthetic-categorical``).

Each request draws a *session interest*, one item category (uniform over the categories), that no
other feature carries: a model without the history cannot know it, not from the user id either
(the same user has another interest in each request). The interest shapes two things:

* the request's history: ``n ~ Uniform{0 .. max_len}`` earlier items (0 is an empty history),
  each from the interest's category with probability :data:`IN_SESSION` (Zipf within the category)
  and otherwise from the whole catalog (the usual item Zipf);
* its candidates: each is an item of the interest's category with probability
  :data:`CANDIDATE_IN_SESSION` (the retrieval stage read the session), else a catalog draw.

The teacher gains a fifth term, the overlap of the candidate with the history::

    overlap = (share of the history's items in the candidate's category) + [candidate in the history]

(0 for an empty history), standardized like the other terms and weighted by
:data:`HISTORY_WEIGHT`. It is a function of the history and the candidate alone, so the true
click probability stays known and each split keeps its Bayes NE.
"""

from __future__ import annotations

import numpy as np

IN_SESSION = 0.8  # a history item comes from the session's category
CANDIDATE_IN_SESSION = 0.3  # a candidate comes from the session's category
HISTORY_WEIGHT = 1.2  # the standardized overlap term's weight (the other four: 0.6 .. 0.8)


class SessionHistory:
    """Draws histories and session candidates from an item catalog (item id -> category).

    Args:
        max_len: the longest history (``data.history``).
        category: ``(items + 1,)`` the category of each item id (id 0: none).
        item_cdf: the catalog's rank distribution; ``item_of_rank``: its ids by rank.
    """

    def __init__(self, max_len: int, category: np.ndarray, item_cdf: np.ndarray, item_of_rank: np.ndarray) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"history must be an int >= 1 (the longest history), got {max_len!r}")
        self.max_len, self.category = max_len, category
        self.item_cdf, self.item_of_rank = item_cdf, item_of_rank
        # Items of each category in catalog rank order, and the within-category Zipf over them.
        ranked_categories = category[item_of_rank]  # category of the item at each rank
        self.members = [item_of_rank[ranked_categories == c] for c in range(int(category.max()) + 1)]
        self.member_cdf = [_cdf(len(m)) for m in self.members]
        self.interests = np.array([c for c in range(1, len(self.members)) if len(self.members[c])])

    def draw(self, rng: np.random.Generator, sizes: np.ndarray, items: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(history ids (n, max_len) right-aligned, lengths (n,), candidate items (n,))`` for the
        requests of ``sizes`` candidates; ``items`` ``(n,)`` are catalog draws, some replaced by
        session items."""
        n_req = len(sizes)
        interest = self.interests[rng.integers(0, len(self.interests), n_req)]  # categories with items
        lengths = rng.integers(0, self.max_len + 1, n_req)
        in_session = rng.random((n_req, self.max_len)) < IN_SESSION
        catalog = self.item_of_rank[_ranks(rng, self.item_cdf, n_req * self.max_len)].reshape(n_req, self.max_len)
        session = self._session_items(rng, np.repeat(interest, self.max_len)).reshape(n_req, self.max_len)
        history = np.where(in_session, session, catalog)
        history[np.arange(self.max_len) < (self.max_len - lengths)[:, None]] = 0  # pads first
        row_interest = np.repeat(interest, sizes)
        swap = rng.random(len(items)) < CANDIDATE_IN_SESSION
        candidates = np.where(swap, self._session_items(rng, row_interest), items)
        return np.repeat(history, sizes, axis=0), np.repeat(lengths, sizes), candidates

    def _session_items(self, rng: np.random.Generator, categories: np.ndarray) -> np.ndarray:
        """One item of each of ``categories`` ``(n,)`` (Zipf within the category)."""
        out = np.zeros(len(categories), dtype=np.int64)
        u = rng.random(len(categories))
        for c in np.unique(categories):
            rows = np.flatnonzero(categories == c)
            members = self.members[int(c)]
            if len(members):
                out[rows] = members[np.searchsorted(self.member_cdf[int(c)], u[rows], side="right").clip(
                    max=len(members) - 1)]
        return out

    def overlap(self, items: np.ndarray, history: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The raw overlap term ``(n,)`` of candidates ``items`` with right-aligned ``history``."""
        valid = history > 0  # (n, L)
        same_category = (self.category[history] == self.category[items][:, None]) & valid
        share = same_category.sum(1) / np.maximum(lengths, 1)
        repeat = ((history == items[:, None]) & valid).any(1)
        return share + repeat


def _cdf(n: int, a: float = 1.1) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -a)
    return cdf / cdf[-1] if n else cdf


def _ranks(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    return np.searchsorted(cdf, rng.random(n), side="right").clip(max=len(cdf) - 1)
