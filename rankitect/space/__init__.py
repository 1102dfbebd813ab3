"""rankitect.space: the genotype, search spaces, the model builder, analytic cost and baselines."""

from rankitect.space import engineer, nasrec  # noqa: F401  (registers the presets)
from rankitect.space.architecture import Architecture, BlockGene, HeadGene, Params
from rankitect.space.builder import RankingModel, build_model
from rankitect.space.flops import Cost, cost, dense_params, flops, params
from rankitect.space.space import SPACES, Choice, SearchSpace, get_space, register_space

__all__ = [
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
    "flops",
    "get_space",
    "params",
    "register_space",
]
