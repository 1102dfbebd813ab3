"""rankitect.search.judging: how trials are judged.

* :mod:`~rankitect.search.judging.pruning`: successive halving stops unpromising trainings early;
* :mod:`~rankitect.search.judging.selection`: the winner rule and the ``auto`` FLOPs target
  (paired standard errors);
* :mod:`~rankitect.search.judging.standings`: where a search's trials stand (running best, Pareto
  table, kept weights).

Modules here import each other by their own names; nothing is re-exported.
"""
