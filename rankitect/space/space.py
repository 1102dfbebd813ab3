"""Search spaces: a flat dict of labelled choices and a pure ``decode(sample) -> Architecture``.

A *sample* maps every label to one of its options (JSON scalars, so Optuna can suggest them).
A preset subclasses :class:`SearchSpace` and writes two functions: ``_decode`` (reads labels from
the sample and builds the genes) and ``_encode`` (reads an architecture back into a sample). The
labels a decode reads are the *active* ones; the others are ignored (they may even be missing), so
activity is never declared twice. ``encode`` is checked by decoding: it returns a sample only if
that sample decodes to exactly the given architecture.

Presets are registered in :data:`SPACES` and built with :func:`get_space`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rankitect.blocks.common import check_share
from rankitect.registry import Registry
from rankitect.space.architecture import Architecture
from rankitect.space.recipe_space import PREFIX, apply_recipe, check_recipe_menus, read_recipe, strip_recipe

_OPTION_TYPES = (bool, int, float, str, type(None))
SHARE_LABEL = "rocs_share"  # the choice of Architecture.rocs_share in a ROCS space
MAX_MUTATION_TRIES = 200


@dataclass(frozen=True)
class Choice:
    """One labelled choice: ``options`` are distinct JSON scalars (int, float, str, bool, None).

    >>> Choice("b0.width", (16, 32)).options
    (16, 32)
    """

    label: str
    options: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        if not self.options:
            raise ValueError(f"choice {self.label!r}: needs at least one option")
        for o in self.options:
            if not isinstance(o, _OPTION_TYPES):
                raise ValueError(f"choice {self.label!r}: option {o!r} is not a JSON scalar")
        keys = [(type(o), o) for o in self.options]
        if len(set(keys)) != len(keys):
            raise ValueError(f"choice {self.label!r}: duplicate options in {list(self.options)}")

    def index(self, value: Any) -> int:
        """Position of ``value`` among the options (type-exact: ``True`` is not ``1``)."""
        for i, o in enumerate(self.options):
            if type(o) is type(value) and o == value:
                return i
        raise ValueError(f"choice {self.label!r}: {value!r} is not one of {list(self.options)}")


class SampleReader(Mapping[str, Any]):
    """Read access to a sample that checks each value and records which labels were read."""

    def __init__(self, choices: Mapping[str, Choice], sample: Mapping[str, Any]) -> None:
        self._choices, self._sample = choices, sample
        self.read: list[str] = []

    def __getitem__(self, label: str) -> Any:
        if label not in self._choices:
            raise KeyError(f"the space has no choice {label!r}")
        if label not in self._sample:
            raise ValueError(f"sample: missing active choice {label!r}")
        value = self._sample[label]
        self._choices[label].index(value)
        if label not in self.read:
            self.read.append(label)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._choices)

    def __len__(self) -> int:
        return len(self._choices)


class SearchSpace:
    """Base class of the presets: labelled choices, sampling, decode/encode and mutation.

    Args:
        name: the preset's name in :data:`SPACES`.
        choices: the labelled choices, in a fixed order (sampling draws them in this order).
        options: the preset options it was built with (logged by :meth:`to_dict`).
        rocs_shares: for a ROCS space, the menu of ``Architecture.rocs_share``: one more choice,
            ``rocs_share``, that this class decodes and encodes for every preset.
        recipe: menus of recipe genes (:mod:`rankitect.space.recipe_space`): one more choice per
            gene, ``recipe.<gene>``, that this class decodes and encodes for every preset.
    """

    def __init__(
        self, name: str, choices: Sequence[Choice], options: Mapping[str, Any],
        *, rocs_shares: Sequence[float | None] | None = None, recipe: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        self.name = name
        self.choices: dict[str, Choice] = {}
        options = dict(options)
        if rocs_shares is not None:
            options["rocs_shares"] = share_menu(rocs_shares)
            choices = [*choices, Choice(SHARE_LABEL, options["rocs_shares"])]
        self.recipe_genes: tuple[str, ...] = ()
        self.options = options
        self._add_choices(choices)
        if recipe:
            self.add_recipe(recipe)

    def _add_choices(self, choices: Sequence[Choice]) -> None:
        for c in choices:
            if c.label in self.choices:
                raise ValueError(f"space {self.name!r}: duplicate choice label {c.label!r}")
            self.choices[c.label] = c

    def add_recipe(self, recipe: Mapping[str, Sequence[Any]]) -> None:
        """Add one choice per recipe gene of ``recipe`` (gene -> menu), labelled ``recipe.<gene>``,
        after the preset's own; :func:`get_space` calls it for a preset whose factory takes no
        ``recipe`` option (a user's space), so every space searches the recipe."""
        if self.recipe_genes:
            raise ValueError(f"space {self.name!r} already has recipe choices {list(self.recipe_genes)}")
        menus = check_recipe_menus(recipe, int(self.options.get("embedding_dim", 16)))
        if not menus:
            return
        self.options["recipe"] = {k: list(v) for k, v in menus.items()}
        self._add_choices([Choice(PREFIX + gene, menu) for gene, menu in menus.items()])
        self.recipe_genes = tuple(menus)

    def _decode(self, sample: Mapping[str, Any]) -> Architecture:
        raise NotImplementedError

    def _encode(self, arch: Architecture) -> dict[str, Any] | None:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """Draw every choice uniformly (inactive ones too: decode ignores them)."""
        return {label: c.options[int(rng.integers(len(c.options)))] for label, c in self.choices.items()}

    def decode(self, sample: Mapping[str, Any]) -> Architecture:
        """The architecture of ``sample`` (pure; inactive labels are ignored)."""
        return self._read(SampleReader(self.choices, sample))

    def active(self, sample: Mapping[str, Any]) -> list[str]:
        """The labels that decoding ``sample`` reads, in reading order."""
        reader = SampleReader(self.choices, sample)
        self._read(reader)
        return list(reader.read)

    def _read(self, reader: SampleReader) -> Architecture:
        """The preset's decode, plus the request share of a ROCS space and the recipe genes."""
        arch = self._decode(reader)
        if SHARE_LABEL in self.choices:
            arch = replace(arch, rocs_share=reader[SHARE_LABEL])
        if self.recipe_genes:
            arch = apply_recipe(arch, {gene: reader[PREFIX + gene] for gene in self.recipe_genes})
        return arch

    def encode(self, arch: Architecture) -> dict[str, Any] | None:
        """A full sample (every label) that decodes to ``arch``, or ``None`` if ``arch`` is not in the space."""
        recipe = read_recipe(arch, self.recipe_genes)
        if recipe is None:
            return None
        try:
            partial = self._encode(strip_recipe(arch) if self.recipe_genes else arch)
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        if partial is None:
            return None
        if SHARE_LABEL in self.choices:
            partial[SHARE_LABEL] = arch.rocs_share
        partial.update({PREFIX + gene: value for gene, value in recipe.items()})
        sample = {label: partial.get(label, c.options[0]) for label, c in self.choices.items()}
        try:
            return sample if self.decode(sample) == arch else None
        except ValueError:
            return None

    def contains(self, arch: Architecture) -> bool:
        return self.encode(arch) is not None

    def mutate(self, arch: Architecture, rng: np.random.Generator, num_mutations: int = 1) -> Architecture:
        """Re-draw ``num_mutations`` active choices (one at a time) to other options.

        Each step must change the architecture; the result differs from ``arch``. Raises
        ``ValueError`` if ``arch`` is not in the space.
        """
        if isinstance(num_mutations, bool) or not isinstance(num_mutations, int) or num_mutations < 1:
            raise ValueError(f"num_mutations must be an int >= 1, got {num_mutations!r}")
        sample = self.encode(arch)
        if sample is None:
            raise ValueError(f"mutate: architecture {arch.hash} is not in space {self.name!r}")
        current = arch
        for _ in range(num_mutations):
            sample, current = self._mutate_once(sample, current, arch, rng)
        return current

    def _draw_woken(self, before: dict[str, Any], after: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """``after`` with the labels its change wakes (inactive in ``before``, read by ``after``) drawn
        afresh, as a new sample draws them, until no further label wakes.

        An encoded architecture holds its inactive labels at their first options, so without this a
        mutation that deepens a stack, swaps a layer's op or routes the dense features into the
        fields would always open the first option of what it opens (the first op, the narrowest
        knobs, tokens rather than buckets), and what lies behind it only a second mutation could
        reach. Drawing it is how conditional spaces are sampled (ConfigSpace's neighbourhoods do the
        same for newly active children).
        """
        settled = set(self.active(before))
        for _ in range(len(self.choices)):
            woken = [lb for lb in self.active(after) if lb not in settled]
            if not woken:
                break
            for lb in woken:  # the mutated label was active before: it keeps its new value
                options = self.choices[lb].options
                after[lb] = options[int(rng.integers(len(options)))]
            settled.update(woken)
        return after

    def _mutate_once(
        self, sample: dict[str, Any], current: Architecture, original: Architecture, rng: np.random.Generator
    ) -> tuple[dict[str, Any], Architecture]:
        for _ in range(MAX_MUTATION_TRIES):
            movable = [lb for lb in self.active(sample) if len(self.choices[lb].options) > 1]
            if not movable:
                break
            label = movable[int(rng.integers(len(movable)))]
            choice = self.choices[label]
            others = [o for i, o in enumerate(choice.options) if i != choice.index(sample[label])]
            candidate = self._draw_woken(sample, {**sample, label: others[int(rng.integers(len(others)))]}, rng)
            child = self.decode(candidate)
            if child != current and child != original:
                return candidate, child
        raise RuntimeError(f"space {self.name!r}: no mutation changed the architecture in {MAX_MUTATION_TRIES} tries")

    def to_dict(self) -> dict[str, Any]:
        """The space as JSON data, for logging: name, options and every choice's options."""
        opts = {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()}
        return {"name": self.name, "options": opts, "choices": {lb: list(c.options) for lb, c in self.choices.items()}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.choices)} choices)"


SPACES: Registry[Callable[..., SearchSpace]] = Registry("search space")


def register_space(name: str) -> Callable[[Callable[..., SearchSpace]], Callable[..., SearchSpace]]:
    """Decorator adding a preset factory to :data:`SPACES`; a second one of one name is an error."""
    return SPACES.register(name)


def get_space(name: str, **options: Any) -> SearchSpace:
    """Build preset ``name`` with ``options`` (each a keyword of the preset's factory, but ``recipe``, which
    every space takes: a factory without it gets its recipe choices from :meth:`SearchSpace.add_recipe`).

    >>> space = get_space("nasrec", num_blocks=2, widths=(16, 32), tokens=(4, 8))
    >>> arch = space.decode(space.sample(np.random.default_rng(0)))
    >>> space.contains(arch), space.encode(arch) is not None
    (True, True)
    >>> get_space("nasrec", width=(16,))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: space 'nasrec': unknown option 'width'; known: ['embedding_dim', ..., 'widths']
    """
    factory = SPACES[name]  # an unknown name: a ValueError listing the known ones
    known = sorted(inspect.signature(factory).parameters)
    recipe = options.pop("recipe") if "recipe" in options and "recipe" not in known else None
    for key in options:
        if key not in known:
            raise ValueError(f"space {name!r}: unknown option {key!r}; known: {known}")
    space = factory(**options)
    if recipe:  # a factory without a recipe option (a user's space): its recipe choices added here
        space.add_recipe(recipe)
    return space


ROCS_SHARES: tuple[float | None, ...] = (None, 0.5, 0.75, 0.9)
"""Default menu of ``rocs_share`` in a ``rocs=True`` space: ``None`` keeps each masked layer's
request outputs proportional to its request inputs; a float gives that fraction of its outputs to
the request side (cheaper per candidate, fewer candidate-side units). With search.rocs the
objective counts FLOPs per example of request-shared scoring, so the search weighs the two."""


def share_menu(shares: Sequence[float | None]) -> tuple[float | None, ...]:
    """A checked ``rocs_share`` menu: each entry ``None`` or a float in (0, 1).

    >>> share_menu([None, 0.5])
    (None, 0.5)
    """
    return tuple(check_share(v, f"option 'rocs_shares': {v!r}") for v in as_tuple("rocs_shares", shares))


def as_tuple(name: str, value: Sequence[Any]) -> tuple[Any, ...]:
    """A preset option given as a list or tuple, as a non-empty tuple."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"option {name!r} must be a non-empty list, got {value!r}")
    return tuple(value)
