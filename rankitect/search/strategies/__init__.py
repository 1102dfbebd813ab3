"""rankitect.search.strategies: every registered strategy, one module per strategy.

* :mod:`~rankitect.search.strategies.random`: ``random``, uniform samples never proposed twice
  (and the sampling that ``evolution`` shares);
* :mod:`~rankitect.search.strategies.evolution`: ``evolution``, regularized (aging) evolution;
* :mod:`~rankitect.search.strategies.tpe`: ``tpe``, and :mod:`~rankitect.search.strategies.nsga2`:
  ``nsga2``, each one of Optuna's samplers on the family base
  :mod:`~rankitect.search.strategies.optuna` (the Optuna plumbing, :mod:`rankitect.search._optuna`,
  also serves the shared history and the pruner, so it stays in ``search/``);
* :mod:`~rankitect.search.strategies.oneshot`: ``oneshot``, evolution on a supernet's inherited
  weights, then retraining;
* :mod:`~rankitect.search.strategies.dnas`: ``dnas``, architecture weights trained with a
  supernet, then retraining and a climb from the best trained architecture.

A strategy holds its ask / tell / state; the supernet phases that ``oneshot`` and ``dnas`` run
first live in :mod:`rankitect.supernet`. Importing this package registers every strategy.
"""

from rankitect.search.strategies import dnas, evolution, nsga2, oneshot, random, tpe  # noqa: F401  (registers them)
