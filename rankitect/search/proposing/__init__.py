"""rankitect.search.proposing: what a strategy draws on to propose the next candidate.

* :mod:`~rankitect.search.proposing.surrogate`: a surrogate of validation NE that ranks drawn proposals;
* :mod:`~rankitect.search.proposing.plan_proposer`: the proposers with a supernet phase (``oneshot``, ``dnas``);
* :mod:`~rankitect.search.proposing.history`: what ``random`` and ``evolution`` remember;
* :mod:`~rankitect.search.proposing.sizing`: a preset's menus sized to the data;
* :mod:`~rankitect.search.proposing.estimate`: how long a search will take, before its first trial.

Modules here import each other by their own names; nothing is re-exported.
"""
