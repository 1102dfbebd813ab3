"""rankitect.space: the genotype, search spaces, the model builder, analytic cost and baselines.

>>> import numpy as np
>>> from rankitect.space.testing import tiny_batch, tiny_spec
>>> space = get_space("engineer", embedding_dim=8)
>>> arch = space.decode(space.sample(np.random.default_rng(0)))
>>> build_model(arch, tiny_spec())(tiny_batch(tiny_spec(), 2)).shape
torch.Size([2])
"""

from rankitect.space import engineer, nasrec  # noqa: F401  (importing them registers the presets)
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.params import Params
from rankitect.space.baselines import BASELINES, engineer_space_for, get_baseline
from rankitect.space.builder import RankingModel, build_model
from rankitect.space.flops import Cost, cost, dense_params, flops, params
from rankitect.space.space import SPACES, Choice, SearchSpace, get_space, register_space

__all__ = [
    "BASELINES",
    "SPACES",
    "Architecture",
    "BlockGene",
    "Choice",
    "Cost",
    "HeadGene",
    "Params",
    "RankingModel",
    "SearchSpace",
    "build_model",
    "cost",
    "dense_params",
    "engineer_space_for",
    "flops",
    "get_baseline",
    "get_space",
    "params",
    "register_space",
]
