"""The rules every config obeys: one range table for every number (:data:`RANGES`, with
:data:`BOUNDED_BY`), the values that are not numbers (device, FLOPs range, baselines), and the
keys of earlier versions (:data:`RENAMED`).

Kept apart from the dataclasses of :mod:`rankitect.config` so that the schema reads as a schema;
the rules read sections as plain data (:func:`flatten` of :func:`to_dict`) and so import nothing
of it.

>>> from rankitect.config import SearchConfig
>>> check_section(SearchConfig(trials=0), "search")
Traceback (most recent call last):
...
rankitect.errors.ConfigError: config key 'search.trials' must be >= 1, got 0
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NamedTuple

from rankitect.errors import ConfigError


class Range(NamedTuple):
    """Allowed values of a numeric key: ``low <= v`` (``low < v`` when ``open_low``), ``v <= high``."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def __contains__(self, v: object) -> bool:
        if not isinstance(v, (int, float)) or not math.isfinite(v):  # NaN and infinities are in no range
            return False
        above = self.low is None or (v > self.low if self.open_low else v >= self.low)
        return above and (self.high is None or v <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low}, {self.high}]"
        if self.low is not None:
            return f"{'>' if self.open_low else '>='} {self.low}"
        return f"<= {self.high}"


AT_LEAST_0, AT_LEAST_1, POSITIVE = Range(0), Range(1), Range(0, open_low=True)


def _supernet_ranges(section: str) -> dict[str, Range]:
    return {f"{section}.supernet.steps": AT_LEAST_1, f"{section}.supernet.epochs": POSITIVE,
            f"{section}.supernet.top_k": AT_LEAST_1, f"{section}.supernet.log_every": AT_LEAST_1}


# Every int and float key of the dataclasses above (a test checks that none is missing), checked by
# ``load_config`` so that a wrong number stops the command before any data is read; a strategy given
# its section directly is checked against the same table (:func:`check_section`).
RANGES: dict[str, Range] = {
    "data.rows": Range(100), "data.seed": AT_LEAST_0, "data.ctr": Range(0, 1, open_low=True), "data.vocab_size": Range(2),
    "data.history": AT_LEAST_0,
    "train.max_epochs": AT_LEAST_1, "train.steps": AT_LEAST_1, "train.patience": AT_LEAST_0,
    "train.batch_size": AT_LEAST_1, "train.lr_dense": POSITIVE,
    "train.lr_sparse": POSITIVE, "train.weight_decay": AT_LEAST_0, "train.val_every": AT_LEAST_0,
    "train.val_batches": AT_LEAST_0, "train.test_batches": AT_LEAST_0, "train.grace_steps": AT_LEAST_0,
    "train.seed": AT_LEAST_0,
    "search.trials": AT_LEAST_1, "search.seed": AT_LEAST_0, "search.target_mflops": POSITIVE,
    "search.time_budget": POSITIVE,  # in seconds; a string ("90m") is checked by search.budget.parse_duration
    "search.pruning_reduction": Range(2), "search.pruning_min_validations": AT_LEAST_1,
    "search.penalty_weight": AT_LEAST_0, "search.min_gain_se": AT_LEAST_0, "search.workers": AT_LEAST_1, "search.keep_top_k": AT_LEAST_0,
    "search.evolution.population": AT_LEAST_1, "search.evolution.sample_size": AT_LEAST_1,
    **_supernet_ranges("search.oneshot"), "search.oneshot.widest_decay_steps": AT_LEAST_0,
    "search.oneshot.population": AT_LEAST_1, "search.oneshot.sample_size": AT_LEAST_1,
    "search.oneshot.children": AT_LEAST_0, "search.oneshot.finetune_batches": AT_LEAST_1,
    "search.oneshot.finetune_steps": AT_LEAST_0, "search.oneshot.score_batches": AT_LEAST_1,
    **_supernet_ranges("search.dnas"), "search.dnas.weights_only_steps": AT_LEAST_0,
    "search.dnas.stable_steps": AT_LEAST_0, "search.dnas.patience": AT_LEAST_0, "search.dnas.arch_every": AT_LEAST_1,
    "search.dnas.arch_lr": POSITIVE, "search.dnas.start_logit": AT_LEAST_0,
    "search.dnas.gumbel.tau_start": POSITIVE, "search.dnas.gumbel.tau_end": POSITIVE,
    "search.dnas.reinforce.samples": Range(2),  # each path is scored against the others
    "search.dnas.ranking.every": AT_LEAST_1, "search.dnas.ranking.min_kendall_tau": Range(-1, 1),
    "search.surrogate.candidates": AT_LEAST_1, "search.surrogate.kappa": AT_LEAST_0,
    "search.surrogate.min_trials": Range(2),
    "search.verdict.fraction": Range(0, 0.9), "search.verdict.finalists": AT_LEAST_1,
    "search.verdict.min_gain_se": AT_LEAST_0,
    "runtime.fp8_threshold": AT_LEAST_0, "runtime.threads": AT_LEAST_0, "runtime.memory_budget": POSITIVE,
}
# Keys bounded by another key: (key, its upper bound).
BOUNDED_BY = [("search.evolution.sample_size", "search.evolution.population"),
              ("search.oneshot.sample_size", "search.oneshot.population")]
# Keys of earlier versions and where they live now: a config or override naming one is refused
# with the new name; a checkpoint's logged config is moved over (:func:`rename_old_keys`).
RENAMED: dict[str, str] = {
    "train.warmup_steps": "train.grace_steps",
    **{f"search.{s}.{old}": f"search.{s}.supernet.{new}" for s in ("oneshot", "dnas") for old, new in
       (("supernet_steps", "steps"), ("epochs", "epochs"), ("top_k", "top_k"), ("log_every", "log_every"))},
    "search.oneshot.warmup_steps": "search.oneshot.widest_decay_steps",
    "search.dnas.warmup_steps": "search.dnas.weights_only_steps",
    "search.dnas.tau_start": "search.dnas.gumbel.tau_start",
    "search.dnas.tau_end": "search.dnas.gumbel.tau_end",
    "search.dnas.samples": "search.dnas.reinforce.samples",
    "search.dnas.rank_every": "search.dnas.ranking.every",
    "search.dnas.rank_tau": "search.dnas.ranking.min_kendall_tau",
}


def validate(cfg: Any) -> Any:
    """``cfg`` if every numeric key lies in its :data:`RANGES` entry (and under its
    :data:`BOUNDED_BY` bound) and every other value is one the commands can run with; else a
    ``ConfigError`` naming the first key outside, its range and its value."""
    check_section(cfg, "")
    _check_choices(cfg)
    return cfg


def check_section(section: Any, key: str) -> None:
    """Check the numbers of config section ``section`` (the dataclass at dotted ``key``, e.g. a
    :class:`DnasConfig` at ``search.dnas``; ``""``: the whole :class:`Config`) against
    :data:`RANGES` and :data:`BOUNDED_BY`, in one message form naming the key and its value."""
    prefix = f"{key}." if key else ""
    flat = flatten(to_dict(section), prefix)
    for name, allowed in RANGES.items():
        value = flat.get(name)
        if value is not None and not isinstance(value, str) and value not in allowed:
            raise ConfigError(f"config key {name!r} must be {allowed}, got {value!r}")
    for name, bound in BOUNDED_BY:
        if name in flat and flat[name] > flat[bound]:
            raise ConfigError(f"config key {name!r} must be <= {bound} ({flat[bound]}), got {flat[name]!r}")
    if flat.get("search.oneshot.supernet.epochs") == "auto":
        raise ConfigError("config key 'search.oneshot.supernet.epochs' must be a number of passes (auto is dnas's: "
                          "the baselines' epochs to their best validation), got 'auto'")


def rename_old_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of plain config data (a checkpoint's logged config) with every :data:`RENAMED` key
    moved to its new name, so that a search logged before a rename resumes."""
    flat = {RENAMED.get(k, k): v for k, v in flatten(raw).items()}
    out: dict[str, Any] = {}
    for k, v in flat.items():
        set_dotted(out, k, v)
    return out


DEVICE = re.compile(r"cpu|cuda(:\d+)?")  # what torch.device and Lightning's accelerator both take here


def _check_choices(cfg: Any) -> None:
    """Values that are neither numbers in a range nor a closed set of literals: the device, the
    FLOPs range's order, the baselines' uniqueness (a ``ConfigError`` naming key and value)."""
    if not DEVICE.fullmatch(cfg.runtime.device):
        raise ConfigError(f"config key 'runtime.device': unknown device {cfg.runtime.device!r}; "
                          "valid: 'cpu', 'cuda', 'cuda:N' (N a GPU index)")
    span = cfg.search.flops_range
    if isinstance(span, list) and not (len(span) == 2 and 0 < span[0] < span[1] < math.inf):
        raise ConfigError(f"config key 'search.flops_range': must be 'auto', null or [low, high] MFLOPs with "
                          f"0 < low < high, got {span!r}")
    seen: set[str] = set()
    for name in cfg.search.baselines:
        if name in seen:
            raise ConfigError(f"config key 'search.baselines': {name!r} is listed twice, got {cfg.search.baselines!r}")
        seen.add(name)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The whole config as plain data (for logging it in full)."""
    return dataclasses.asdict(cfg)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value
