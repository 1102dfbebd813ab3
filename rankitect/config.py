"""Typed configuration: dataclasses loaded strictly from YAML plus ``key=value`` overrides.

An unknown key, a value of the wrong type or a number outside its range (one table for every
numeric key, :data:`~rankitect.config_rules.RANGES`) raises :class:`~rankitect.errors.ConfigError`
naming the dotted key; the CLI turns that into exit status 2 before any data is read or anything
is written.

>>> cfg = load_config(overrides=["search.trials=8", "train.lr_dense=0.01"])
>>> cfg.search.trials, cfg.train.lr_dense
(8, 0.01)
>>> load_config(overrides=["search.trails=8"])
Traceback (most recent call last):
...
rankitect.errors.ConfigError: unknown config key 'search.trails' (known under 'search': ...)
>>> load_config(overrides=["train.steps=0"])
Traceback (most recent call last):
...
rankitect.errors.ConfigError: config key 'train.steps' must be >= 1, got 0
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rankitect.config_rules import RENAMED, set_dotted, validate
from rankitect.errors import ConfigError


@dataclass
class DataConfig:
    """Where the click data comes from. ``source``: ``synthetic``, ``synthetic-categorical`` (an
    all-categorical log: Zipf users and items, no dense features), a Criteo TSV, a CSV/parquet
    file (with ``schema``), or a cache directory written earlier."""

    source: str = "synthetic"  # synthetic | synthetic-categorical | a Criteo TSV | a CSV/parquet file (with schema) | a cache dir
    rows: int | None = None  # generated sets only; null: the generator's default (synthetic 200000, synthetic-categorical 100000)
    seed: int = 0  # generated sets only
    ctr: float | None = None  # generated sets only: their mean click rate; null: the generator's (synthetic 0.25, synthetic-categorical 0.15); e.g. 0.0064 for a rare-click log
    history: int = 0  # synthetic-categorical only: each request's history of up to this many earlier items, clicks depending on its overlap with the candidate; 0: no history
    schema: str | None = None  # CSV / parquet only
    vocab_size: int = 100_000  # hashing buckets per categorical column (Criteo, tabular)
    cache_dir: str | None = None  # default: $RANKITECT_DATA_DIR, else ~/.cache/rankitect/data


@dataclass
class TrainConfig:
    """How every model is trained and evaluated: one protocol (see :mod:`rankitect.train.protocol`).

    Training runs at most ``max_epochs`` passes over the train split (``steps``, when set, caps the
    batches), validates on the whole validation split every epoch (every ``val_every`` steps when
    set; automatically more often on large data), stops after ``patience`` validations without a
    better validation NE, and restores the best validated weights before the test.
    """

    max_epochs: int = 20  # passes over the training split at most
    steps: int | None = None  # optional cap on training steps (batches); None: max_epochs decides
    patience: int = 2  # validations without a better validation NE before stopping; 0 = never stop early
    batch_size: int = 512  # rows per training, validation and test batch (a training pass joins a shorter last batch to the one before it)
    lr_dense: float = 1e-3  # Adam, dense parameters
    lr_sparse: float = 0.05  # row-wise Adagrad, embedding tables
    weight_decay: float = 0.0  # of the dense parameters
    val_every: int = 0  # training steps between validations; 0 = every epoch (more often on large data)
    val_batches: int = 0  # 0 = the whole validation split
    test_batches: int = 0  # 0 = the whole test split
    grace_steps: int = 0  # validation NE above 1.5 at or after this step ends a training as diverged (NaN or inf: at any step)
    seed: int = 0
    progress: bool = True  # a progress bar while training (search trials: one bar for the search)


@dataclass
class EvolutionConfig:
    """The ``evolution`` strategy: regularized (aging) evolution. Proposals are random until
    ``population`` trials have finished (the baselines the space holds count: with the default
    six, 2 random trials), then each is a mutated child of a tournament's winner."""

    population: int = 8  # tournaments draw from the most recent this many trained trials
    sample_size: int = 4  # members drawn per tournament (at most population)


@dataclass
class SupernetConfig:
    """The supernet phase of ``oneshot`` and ``dnas``: how long the supernet trains, how many of
    the architectures it chose are retrained first, how often its curves are logged.

    Each strategy's section holds one with defaults of its own (``oneshot``: 600 steps, 1 epoch;
    ``dnas``: 300 steps, epochs ``auto``); in Python change one key with
    ``dataclasses.replace(DnasConfig().supernet, steps=...)`` to keep the others."""

    steps: int = 300  # weight steps at most; see epochs
    epochs: float | Literal["auto"] = 1.0  # at most this many passes over the train split (widest_decay_steps, weights_only_steps shrink in proportion); auto (dnas only): the baselines' median epochs to their best validation, at least 1
    top_k: int = 1  # the supernet's best architectures (oneshot: by inherited-weight score; dnas: most probable) retrained from scratch first; then more until search.trials are trained
    log_every: int = 10  # supernet steps between rows of its training curves


@dataclass
class OneShotConfig:
    """The ``oneshot`` strategy: train a supernet on single paths, evolve on inherited weights."""

    supernet: SupernetConfig = field(default_factory=lambda: SupernetConfig(steps=600, epochs=1.0))
    widest_decay_steps: int = 200  # the widest path is drawn with a probability falling linearly from 1 to 0 over these steps
    population: int = 16
    sample_size: int = 4
    children: int = 32  # mutated children scored after the initial population
    finetune_batches: int = 4  # training batches whose features the head is fine-tuned on
    finetune_steps: int = 20  # head-only steps over those features before a child is scored
    score_batches: int = 10  # validation batches a child is scored on


@dataclass
class GumbelConfig:
    """``search.dnas.estimator: gumbel``: hard Gumbel-softmax samples with a straight-through gradient."""

    tau_start: float = 5.0  # temperature at the first supernet step, annealed exponentially
    tau_end: float = 0.5  # temperature at the last step


@dataclass
class ReinforceConfig:
    """``search.dnas.estimator: reinforce``: the score function with a leave-one-out baseline."""

    samples: int = 2  # paths scored against each other on one batch per architecture step


@dataclass
class RankingConfig:
    """The supernet's order of its probe paths (the trained baselines, changes of the start): a stop
    rule (``stop: ranking``, read while it trains: ``rank/*`` curves) and, after it, a check of its choices."""

    every: int = 20  # stop: ranking, weight steps between readings of the probes' order
    min_kendall_tau: float = 0.2  # the supernet ranks the trained baselines (3 or more) below this Kendall tau: the output says so and, with more trials than supernet.top_k, its choices are skipped and the climb starts at once


@dataclass
class DnasConfig:
    """The ``dnas`` strategy: architecture weights over every choice, trained together with the
    supernet's weights; their steps score paths on training batches the weights have not yet seen
    (``arch_split: train``, the default) or on validation batches (``val``)."""

    supernet: SupernetConfig = field(default_factory=lambda: SupernetConfig(steps=300, epochs="auto"))
    weights_only_steps: int = 50  # weight steps (paths drawn from the starting distribution) before the first architecture step
    arch_every: int = 1  # an architecture step after every this many weight steps
    arch_lr: float = 0.05
    arch_split: Literal["train", "val"] = "train"  # batches the architecture steps on (train: rows not yet seen)
    start_logit: float = 2.0  # the best baseline in the space starts this much more probable per choice (a sampled path keeps most of its choices); 0: uniform
    estimator: Literal["reinforce", "gumbel"] = "reinforce"  # architecture gradient: score function (search.dnas.reinforce) or straight-through (search.dnas.gumbel)
    stop: Literal["argmax", "ranking"] = "argmax"  # argmax: once the most probable architecture held stable_steps; ranking: once the supernet's order of its probe paths holds (search.dnas.ranking)
    stable_steps: int = 40  # stop: argmax, once the most probable architecture, having left the start, held this many arch steps; 0: never
    patience: int = 4  # retraining proposals without a new best by objective before, until one is found, surrogate-ranked samples of the whole space take every other turn of the climb and several-choice changes of the best (2, 3, ... choices) every other change's, within the FLOPs target; 0: never
    gumbel: GumbelConfig = field(default_factory=GumbelConfig)
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    ranking: RankingConfig = field(default_factory=RankingConfig)


@dataclass
class SurrogateConfig:
    """Proposals of ``random``, ``evolution`` and ``dnas``'s changes ranked by a surrogate of validation NE fitted on every finished trial."""

    enabled: bool = True  # false: each proposal is the first one drawn
    candidates: int = 32  # drawn per proposal of random and evolution (samples, mutations of the tournament winner); the best-ranked is trained (dnas's climb ranks every untried change of its origin)
    kappa: float = 1.0  # rank by predicted NE minus this many spreads of the ensemble (lower confidence bound); higher explores more
    min_trials: int = 4  # finished trials (baselines included) before it ranks; until then the first drawn is trained


@dataclass
class VerdictConfig:
    """The search's final choice between the best baseline and its finalists, made on validation rows
    held out from everything else the search does (training, early stopping, pruning, the
    surrogate, the supernet, ranking): see docs/search.md, "The verdict"."""

    fraction: float = 0.5  # share of the validation split's requests held out for the verdict; 0: none (the winner rule on validation decides)
    finalists: int = 3  # candidates judged on the held-out rows: the best by validation objective among those better than the best baseline on validation
    min_gain_se: float = 1.0  # a finalist replaces the best baseline only when better on the held-out rows by more than this many paired standard errors


@dataclass
class SearchConfig:
    """What to search, how, and how candidates are ranked."""

    strategy: str = "evolution"  # random | evolution | tpe | nsga2 | oneshot | dnas
    space: str = "engineer"  # holds the six baselines; nasrec | engineer | nasrec_full (NASRec-Full's menus)
    flops_range: Literal["auto"] | list[float] | None = "auto"  # menus sized to [low, high] MFLOPs; null: preset's
    rocs: bool = False  # only architectures whose field mixing is ROCS-masked (request side once per request)
    trials: int = 16  # candidates to train (a pruned one gives its slot back)
    seed: int = 0
    target_mflops: float | Literal["auto", "simplest", "cheapest"] | None = "auto"  # auto: the FLOPs of the best baseline by val NE (lower NE at no more cost); simplest: of the cheapest baseline within min_gain_se standard errors of it by val NE; cheapest: of the cheapest baseline within min_gain_se standard errors of the best by the objective; a number; null: NE alone
    time_budget: str | float | None = None  # wall clock of the whole search, e.g. "90m", "4h", "3600" (seconds); None: trials decide
    pruning: Literal["asha", "hyperband", "none"] = "asha"  # stop unpromising candidates early: successive halving; hyperband: brackets of later first rungs
    pruning_reduction: int = 3  # successive halving keeps the best 1/this of the trials at each rung
    pruning_min_validations: int | Literal["auto"] = "auto"  # validations before a candidate may first be pruned (rungs at this x reduction^k); auto: the earliest first rung that would have kept the best baseline (1 with fewer than 2 baselines)
    pruning_early_rung: bool | Literal["auto"] = "auto"  # asha: the first rung moved a reduction-th of the way down (validation min_validations // reduction, or where that is 0 a probe validation 1/reduction of the first validation interval), the later rungs kept; auto: where successive halving over the baselines keeps the best of them there
    penalty: Literal["absolute", "relaxed"] = "relaxed"  # NE x (1 + w x doublings): relaxed above F0; absolute |log2|
    penalty_weight: float = 0.01  # w: relative NE cost per doubling of FLOPs beyond the target
    min_gain_se: float = 1.0  # a candidate beats the best baseline only by more than this many paired standard errors of validation; 0: lowest objective wins
    workers: int | Literal["auto"] = "auto"  # local worker processes training the trials (baselines and candidates); auto: one per core, at most 4 (1: in the search's own process)
    storage: str | None = None  # Optuna RDB URL shared by several search processes (SQLite, PostgreSQL)
    study_name: str | None = None  # the study in storage
    output_dir: str | None = None  # checkpoint, Pareto table, best genotype; default: beside the store
    keep_top_k: int = 3  # candidates whose trained weights are kept as MLflow artifacts (baselines: all)
    reuse_baselines: bool = True  # a baseline trained on the same data, recipe, seed and protocol in this run store is reused, not trained again; false: every baseline trains
    baselines: list[str] = field(default_factory=lambda: ["dlrm", "dcnv2", "deepfm", "autoint", "wukong", "dhen"])
    evolution: EvolutionConfig = field(default_factory=EvolutionConfig)
    oneshot: OneShotConfig = field(default_factory=OneShotConfig)
    dnas: DnasConfig = field(default_factory=DnasConfig)
    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)


@dataclass
class TrackConfig:
    """Where searches and models are tracked (MLflow)."""

    uri: str | None = None  # default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db
    experiment: str = "rankitect"  # MLflow experiment name


@dataclass
class RuntimeConfig:
    """How models train on this machine: device, compilation, precision, sharding, threads."""

    device: str = "cpu"  # cpu | cuda | cuda:N
    compile: bool = False  # torch.compile the training forward (pays off over thousands of steps)
    compile_fusion: bool = True  # with compile: Inductor's Optimus batch-fusion passes
    precision: Literal["fp32", "bf16", "fp8"] = "fp32"  # bf16: autocast (Lightning bf16-mixed); fp8: safe layers
    fp8_threshold: float = 0.1  # fp8: a linear goes FP8 if the probe's relative output error is at most this
    fp8_scaling: Literal["tensorwise", "rowwise"] = "rowwise"  # fp8: scaling granularity of the casts
    sharding: Literal["none", "torchrec"] = "none"  # torchrec: shard embedding tables under torchrun
    threads: int = 0  # torch intra-op threads of the search's process and of each worker; 0: all cores in the search's process (supernet phases, trials without workers), the cores shared out among workers
    memory_budget: float | None = None  # GB a supernet (weights, optimizer state), or one model in training (with a batch of activations), may take; null: half the RAM


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at ``path`` (if any), then ``key=value`` overrides."""
    return config_from_dict(_read_yaml(path) if path is not None else {}, overrides)


def config_from_dict(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A config from plain data (e.g. a logged config), then ``key=value`` overrides."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        set_dotted(raw, key.strip(), yaml.safe_load(value) if value.strip() else None)
    return validate(_build(Config(), raw, prefix=""))


def _read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, got {type(loaded).__name__}")
    return loaded or {}


def _build(base: Any, raw: Any, prefix: str) -> Any:
    """``base`` (a config dataclass instance holding the defaults) with the values of ``raw`` set;
    a nested section starts from ``base``'s own, so a section whose defaults depend on where it
    sits (``search.oneshot.supernet``, ``search.dnas.supernet``) keeps them."""
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"config key {where!r}: expected a mapping, got {raw!r}")
    cls = type(base)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    for name in unknown:
        if prefix + str(name) in RENAMED:
            raise ConfigError(f"config key {prefix + str(name)!r} is now {RENAMED[prefix + str(name)]!r}; "
                              "rename it in the config file or override")
    if unknown:
        raise ConfigError(f"unknown config key {prefix + str(unknown[0])!r} (known under {where!r}: {sorted(fields)})")
    values = {}
    for name, value in raw.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            values[name] = _build(getattr(base, name), value, prefix + name + ".")
        else:
            values[name] = _coerce(value, tp, prefix + name)
    return dataclasses.replace(base, **values)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and type(value) is tp:
        return value
    raise ConfigError(f"config key {key!r}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
