"""rankitect.supernet: one weight-sharing model over a whole search space, and how it is trained.

Below ``search`` (whose ``oneshot`` and ``dnas`` proposers train it), above ``space`` and ``train``:

* :mod:`~rankitect.supernet.model`: :class:`~rankitect.supernet.model.Supernet`, every path of a
  preset space in one module, a path's weights cut from the widest ones; its planned paths
  (:mod:`~rankitect.supernet.steps`) and its embedding stem under the recipe's table widths
  (:mod:`~rankitect.supernet.stem`);
* :mod:`~rankitect.supernet.layout`, :mod:`~rankitect.supernet.presets`: where each choice of a
  preset sits in the supernet;
* :mod:`~rankitect.supernet.widest`, :mod:`~rankitect.supernet.cut`: shared widest blocks and
  how a narrower block's weights are cut from them;
* :mod:`~rankitect.supernet.memory`: what training the supernet holds in memory, before it is built;
* :mod:`~rankitect.supernet.train`: training it on paths, scoring a path, saving it;
* :mod:`~rankitect.supernet.oneshot_phase`: one-shot's phase, training by uniform single paths and
  scoring a child on inherited weights;
* :mod:`~rankitect.supernet.dnas_weights`: DNAS architecture weights over the space's choices;
* :mod:`~rankitect.supernet.dnas_step`, :mod:`~rankitect.supernet.dnas_phase`: DNAS's phase, one
  step of the architecture weights and the loop that trains them with the supernet;
* :mod:`~rankitect.supernet.rank_check`: whether the supernet's scores order paths as training does.

A phase returns what it found; the strategy that runs it keeps the supernet's run and proposes.
"""
