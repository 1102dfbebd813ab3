"""rankitect.search.running: one search run, from its first baseline to its last record.

* :mod:`~rankitect.search.running.runner`: the loop (propose, train and score, record) and resume;
* :mod:`~rankitect.search.running.trial`, :mod:`~rankitect.search.running.launch`: one trial, in
  this process or a pool of workers;
* :mod:`~rankitect.search.running.baseline_phase`: what the trained baselines decide;
* :mod:`~rankitect.search.running.record`, :mod:`~rankitect.search.running.checkpoint`,
  :mod:`~rankitect.search.running.kept`: what a finished trial leaves (checkpoint, child run, weights);
* :mod:`~rankitect.search.running.budget`, :mod:`~rankitect.search.running.progress`: the time
  budget and what a running search shows;
* :mod:`~rankitect.search.running.identity`, :mod:`~rankitect.search.running.shared_study`: what
  a resume or a joining process must share, and how processes share one search.

Modules here import each other by their own names; nothing is re-exported.
"""
