"""The ``dnas`` strategy: differentiable search over every choice of a preset space, then retraining.

First the DNAS phase (:func:`~rankitect.supernet.dnas_phase.dnas_phase`): a supernet and
architecture weights over every choice of the space (ops, widths, inputs ...) trained together,
the architecture weights towards a lower ``objective.torch_value(NE, MFLOPs)`` (NE times the
``relaxed`` or ``absolute`` cost per doubling of FLOPs beyond ``search.target_mflops``,
:mod:`rankitect.eval.objective`), starting around the best trained baseline the space holds. Its
curves, the supernet's weights and the final probabilities (``architecture_probs.json``) are kept on
a ``supernet`` child run.

Then the most probable architecture (and the next ``supernet.top_k - 1``) is retrained from scratch and
scored on the test split; then the retraining goes on, around the best architecture retrained so
far, the changes the architecture weights prefer first (:class:`DnasSearch`), with samples of the
whole space and wider changes of the best taking turns once ``search.dnas.patience`` proposals
bring no new best, until ``search.trials`` are trained (or a time budget is spent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rankitect.config import DnasConfig, SurrogateConfig
from rankitect.eval.objective import Objective, at_most
from rankitect.eval.result import TrialResult
from rankitect.search.base import SearchContext, Space, SpaceExhausted, register_strategy
from rankitect.search.proposing.plan_proposer import PlanProposer
from rankitect.search.strategies.random import draw_new
from rankitect.search.proposing.surrogate import Guide, Guided
from rankitect.space.architecture import Architecture
from rankitect.supernet.dnas_phase import dnas_phase
from rankitect.supernet.dnas_weights import ArchitectureWeights
from rankitect.supernet.rank_check import RankCheck

SAMPLE_TRIES = 256  # draws of a shake at most; uniform samples drawn for each one a sample proposal keeps, at most


@register_strategy("dnas")
class DnasSearch(Guided, PlanProposer):
    """``rankitect search --strategy dnas``: the DNAS phase (:meth:`search`), then the ``supernet.top_k``
    most probable architectures proposed to be retrained from scratch.

    Where ``fill`` (``search.trials``) is more than ``supernet.top_k`` the retraining goes on once those are done, and
    learns from what it retrains: each further ask is the next untried one-choice change of the best
    architecture trained so far by objective (baselines included), the change the architecture
    weights prefer most first (:meth:`~rankitect.supernet.dnas_weights.ArchitectureWeights.neighbours`).
    A change that beats its origin becomes the next origin; an origin whose changes are all tried
    gives way to the next best architecture. Every other change is a simplification: it costs less
    than its origin and no more than the FLOPs target where there is one (:meth:`_climb`), so the
    search also looks for a better model at the target's cost, and for a cheaper one as good as
    the best. Changes may be pruned (``search.pruning``) as evolution's children are; what the supernet
    chose is trained in full. So the supernet orders the moves, and retraining, not the supernet's
    shared weights, decides where the search moves: on small data the shared weights favour small
    paths, and retraining the most probable paths alone, one after another, learns nothing from any
    of them.

    With a surrogate (``search.surrogate``, :mod:`rankitect.search.proposing.surrogate`) the change trained is
    the best-ranked of all the origin's untried ones (42 to 100 around the baselines on the development
    data sets; ties in the weights' order), by a surrogate fitted on every trained model, baselines and
    pruned changes included.

    Once the climb stalls (``search.dnas.patience`` proposals told without a new best by
    objective), until a new best is found (:meth:`_climb`), every other proposal is the surrogate's
    best of uniform samples of the whole space within the FLOPs target, and every other change a
    shake, its best of several-choice changes of the best architecture within the target (wider
    after each). What lies behind an option no trained model holds, or a few interacting choices
    away, is reached as ``random`` and ``evolution`` reach it, while a climb that keeps finding
    better models runs as before.

    Takes the options of :class:`~rankitect.search.proposing.plan_proposer.PlanProposer`; ``config`` is the
    ``search.dnas`` settings.
    """

    config_class = DnasConfig

    def __init__(self, space: Space, *, seed: int, objective: Objective | None = None,
                 config: DnasConfig | None = None, rocs: bool = False, fill: int = 0,
                 surrogate: SurrogateConfig | None = None) -> None:
        super().__init__(space, seed=seed, objective=objective, config=config, rocs=rocs, fill=fill)
        self.guide = Guide.from_config(space, seed, surrogate)  # ranks the climb's changes
        self._best_steps: list[int] = []  # of every trained baseline, for epochs: auto
        self.weights: ArchitectureWeights | None = None  # once searched (or resumed)
        self._climbing = False  # the last ask was a change (see prunable)
        self._climbs = 0  # changes asked: with a FLOPs target, the two kinds take turns (see _climb)
        self._data: Any = None  # the search's data, for the MFLOPs of a change (set by start)
        self._mflops: dict[str, float] = {}  # of changes considered, by genotype hash
        self._known: list[tuple[Architecture, float]] = []  # trained baselines and their val NE
        self._best: str | None = None  # the best trained architecture by objective, when last told
        self._stall = 0  # proposals told since the best by objective last changed (see _climb)
        self._turns = 0  # proposals asked since the climb stalled, until a new best (see _climb)

    @property
    def prunable(self) -> bool:  # type: ignore[override]
        """Whether the architecture last asked may be stopped early: a change, not a chosen one."""
        return self._climbing

    def observe(self, arch: Architecture, result: TrialResult) -> bool:
        """Keep a trained baseline the space holds: the search starts around the best one (and
        never retrains it). Every trained baseline tells ``supernet.epochs: auto`` how long models take here."""
        super().observe(arch, result)
        self.learn(arch, result)
        if result.ok:
            self._known.append((arch, result.val_ne))  # the probes the supernet's ranking is checked on
        if result.ok and result.best_step:
            self._best_steps.append(result.best_step)
        return self.score(arch, result)

    def search(self, context: SearchContext) -> list[Architecture]:
        """The DNAS phase on a supernet of the space; the ``supernet.top_k`` most probable paths."""
        cfg, ranked = self.config, self.ranked()
        with self.supernet_phase(context) as (supernet, curves):
            found = dnas_phase(supernet, context.data, context.train_cfg, cfg, self.objective, seed=context.seed,
                               known=self._known, start=ranked[0] if ranked else None, best_steps=self._best_steps,
                               echo=context.echo, curves=curves, progress=context.progress,
                               deadline=context.deadline, on_step=context.on_step)
            self.weights = found.weights
            context.tracker.log_dict(curves.run_id, self.weights.to_dict(), "architecture_probs.json")
        paths = self.weights.most_probable(cfg.supernet.top_k + len(self.trained))
        flops = {self.space.decode(p).hash: supernet.path_flops(p) / 1e6 for p in paths}
        archs = self.untrained([self.space.decode(p) for p in paths], cfg.supernet.top_k)
        check = found.check
        if check is not None and not self._ranks(check, context.echo) and self.fill > cfg.supernet.top_k and self.scored:
            archs = []  # what it chose is not worth training first: the climb around the best baseline starts
        for arch in archs:
            context.echo(f"dnas: derived {arch.hash} ({flops[arch.hash]:.3f} MFLOPs)")
        if self.fill > len(archs):
            context.echo(f"dnas: then, until {self.fill} are trained (or a time budget is spent), one-choice changes "
                         "of the best architecture trained so far, the most probable first")
        return archs

    def _ranks(self, check: RankCheck, echo: Callable[[str], None]) -> bool:
        """Whether the supernet ranks the trained baselines it holds at ``ranking.min_kendall_tau`` or better (said
        either way); with fewer than three there is nothing to judge by, and it is trusted. Scores
        all tied (tau ``nan``) rank nothing."""
        tau = check.read().tau_truth
        if check.known < 3:
            return True
        ranks = tau >= self.config.ranking.min_kendall_tau  # False for nan
        echo(f"dnas: the supernet ranks the {check.known} trained baselines it holds at Kendall tau {tau:.2f}"
             + ("" if ranks else f", below search.dnas.ranking.min_kendall_tau {self.config.ranking.min_kendall_tau:g}"
                ": it cannot rank here, so "
                + ("retraining starts at once from changes of the best trained architecture"
                   if self.fill > self.config.supernet.top_k else "what it chose is retrained, but trust it less")))
        return ranks

    def start(self, context: SearchContext) -> None:
        super().start(context)
        self._done |= context.finished  # a resumed search proposes no finished candidate again
        self._data = context.data
        if self.guide is not None:
            self.guide.price = self.mflops

    def ask(self) -> Architecture:
        try:
            arch = super().ask()
        except SpaceExhausted:
            if self.fill <= self.config.supernet.top_k or self.weights is None:
                raise
            arch = self._climb(self.weights)
            self._climbing = True
        else:
            self._climbing = False
        return arch

    def _climb(self, weights: ArchitectureWeights) -> Architecture:
        """The next proposal after the supernet's: a one-choice change of the best trained
        architecture that has one left, or, once the climb stalls, a sample of the whole space or a
        several-choice change of the best.

        Two kinds of change take turns: any change (the penalty weighs what it costs), and a
        simplification, a change that costs less than its origin and no more than the FLOPs target
        (``search.target_mflops``, where there is one), of the best architecture that has one left.
        The objective trades NE for FLOPs and its best often lies above the target: the second kind
        keeps looking for a better model at the target's cost, which is what ``target_mflops: auto``
        asks for. Below the target it looks for a cheaper model as good as the best, which is what
        the winner's rule returns (the cheapest candidate within the noise of the best,
        :mod:`rankitect.search.judging.selection`); the first kind grows a model as readily as it shrinks
        it. A kind with nothing left gives its turn to the other.

        Changes move one choice at a time, and the surrogate predicts an option no trained model
        holds as its origin, so a better model several choices away, or one choice away through an
        option nobody tried, is out of the climb's reach. Once ``search.dnas.patience`` proposals
        are told without a new best by objective, the climb has stalled, and until a new best is
        found (which becomes the next origin) every other proposal is the surrogate's best of
        uniform samples of the space within the target (:meth:`_sample`), and every other change is
        a shake (:meth:`_shake`): the surrogate's best of ``k``-choice changes of the best
        architecture within the target, ``k`` = 2, 3, ... one wider after each shake, as a variable
        neighbourhood search widens its neighbourhood after each that fails (Mladenovic and Hansen,
        1997). Samples reach what lies behind an option no trained model holds, shakes what lies a
        few interacting choices from the best. Where the climb keeps finding better models it is
        left alone. A sample is also proposed once no change is left.
        """
        seen = self._done | self._pending | self.trained
        if 0 < self.config.patience <= self._stall:  # stalled: sample, change, sample, shake, ...
            turn, self._turns = self._turns, self._turns + 1
            arch = (self._propose_sample(seen) if turn % 2 == 0
                    else self._propose_shake(seen, 2 + turn // 4) if turn % 4 == 3 else None)
            if arch is not None:
                return arch
        simplify_first = self._climbs % 2 == 1
        for cheaper in (simplify_first, not simplify_first):
            found = self._change(weights, seen, cheaper)
            if found is not None:
                origin, arch = found
                self._climbs += 1
                self._pending.add(arch.hash)
                target = self.objective.target_mflops
                within = ("" if not cheaper else ", cheaper" if target is None
                          else f", cheaper, at no more than {target:.4g} MFLOPs")
                self._echo(f"dnas: retraining {arch.hash} from scratch (a change of {origin.hash}{within})")
                return arch
        arch = self._propose_sample(seen)
        if arch is not None:
            return arch
        raise SpaceExhausted("dnas: every one-choice change of every trained architecture was proposed, "
                             "and no sample of the space within the FLOPs target is untried")

    def _propose_shake(self, seen: set[str], k: int) -> Architecture | None:
        """Ask :meth:`_shake` of the best trained architecture (None when it finds none), said with why."""
        ranked = self.ranked()
        arch = self._shake(ranked[0], k, seen) if ranked else None
        return None if arch is None else self._proposed(arch, f"a {k}-choice change of {ranked[0].hash}")

    def _propose_sample(self, seen: set[str]) -> Architecture | None:
        """Ask :meth:`_sample` (None when it finds none), said with why."""
        arch = self._sample(seen)
        if arch is None:
            return None
        return self._proposed(arch, "a sample of the space")

    def _proposed(self, arch: Architecture, what: str) -> Architecture:
        """Note a sample's or a shake's ``arch`` as proposed, and say so."""
        self._pending.add(arch.hash)
        target = self.objective.target_mflops
        within = "" if target is None else f", at no more than {target:.4g} MFLOPs"
        self._echo(f"dnas: retraining {arch.hash} from scratch ({what}{within}; "
                   f"{self._stall} proposals told without a new best)")
        return arch

    def _shake(self, origin: Architecture, k: int, seen: set[str]) -> Architecture | None:
        """Of up to ``candidates_now()`` ``k``-choice changes of ``origin`` (``space.mutate``), untried
        and at no more than the FLOPs target (if any), the one the surrogate ranks best; None when
        ``SAMPLE_TRIES`` draws find none, or ``origin`` is not in the space."""
        target = self.objective.target_mflops
        found: dict[str, Architecture] = {}
        for _ in range(SAMPLE_TRIES):
            if len(found) >= self.candidates_now():
                break
            try:
                arch = self.space.mutate(origin, self.rng, k)
            except ValueError:
                return None
            if arch.hash in seen or arch.hash in found:
                continue
            if target is None or at_most(self.mflops(arch), target):
                found[arch.hash] = arch
        if not found:
            return None
        archs = list(found.values())
        return archs[self.pick(archs)]

    def _sample(self, seen: set[str]) -> Architecture | None:
        """Of up to ``candidates_now()`` uniform samples of the space, untried and at no more than the
        FLOPs target (if any), the one the surrogate ranks best (``random``'s draw,
        :func:`~rankitect.search.strategies.random.draw_new`); None when ``SAMPLE_TRIES`` draws
        find none."""
        target = self.objective.target_mflops
        try:
            drawn = draw_new(self.space, self.rng, seen, SAMPLE_TRIES, self.candidates_now(),
                             keep=None if target is None else lambda arch: at_most(self.mflops(arch), target))
        except SpaceExhausted:
            return None
        found = [arch for arch, _, _ in drawn]
        return found[self.pick(found)]

    def _change(self, weights: ArchitectureWeights, seen: set[str],
                cheaper: bool) -> tuple[Architecture, Architecture] | None:
        """``(origin, change)``: the most preferred change not in ``seen`` of the best trained
        architecture with one left; where ``cheaper``, a simplification (:meth:`_simpler`)."""
        first_only = self.candidates_now() == 1  # without a surrogate, or before it is ready
        for origin in self.ranked():
            changes: dict[str, Architecture] = {}  # every untried one, the surrogate picks
            for move in weights.neighbours(self.space.encode(origin)):
                try:
                    arch = self.space.decode(move)
                except ValueError:
                    continue
                if arch.hash not in seen and (not cheaper or self._simpler(arch, origin)):
                    changes.setdefault(arch.hash, arch)
                    if first_only:
                        break
            if changes:
                found = list(changes.values())
                return origin, found[self.pick(found)]
        return None

    def _simpler(self, arch: Architecture, origin: Architecture) -> bool:
        """Whether ``arch`` costs less than ``origin`` and no more than the FLOPs target (if any)."""
        target, mflops = self.objective.target_mflops, self.mflops(arch)
        return mflops < self.mflops(origin) and (target is None or at_most(mflops, target))

    def mflops(self, arch: Architecture) -> float:
        """MFLOPs per example as the search ranks ``arch`` (:func:`~rankitect.cost.measure`, served
        at the test split's fan-out where ROCS-masked), once per architecture."""
        if arch.hash not in self._mflops:
            from rankitect.cost import measure
            from rankitect.search.running.trial import candidates_per_request

            fan_out = candidates_per_request(self._data) if arch.rocs else None
            self._mflops[arch.hash] = measure(arch, self._data.spec, fan_out).served_mflops
        return self._mflops[arch.hash]

    def tell(self, arch: Architecture, result: TrialResult) -> None:
        super().tell(arch, result)
        self.score(arch, result)
        self.learn(arch, result)
        ranked = self.ranked()
        best = ranked[0].hash if ranked else None
        if best != self._best:
            self._stall = self._turns = 0
        else:
            self._stall += 1
        self._best = best

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["climbs"] = self._climbs
        state["stall"] = [self._best, self._stall, self._turns]
        state.update(self.guide_state())
        if self.weights is not None:
            state["logits"] = {label: a.tolist() for label, a in zip(self.weights.labels, self.weights.logits)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._climbs = int(state.get("climbs", 0))
        best, stall, turns = state.get("stall", [None, 0, 0])
        self._best, self._stall, self._turns = best, int(stall), int(turns)  # an older state's bool "sampled": 1 = a change is due
        self.load_guide_state(state)
        if "logits" in state:
            self.weights = ArchitectureWeights(self.space)
            with torch.no_grad():
                for label, a in zip(self.weights.labels, self.weights.logits):
                    a.copy_(torch.tensor(state["logits"][label]))


__all__ = ["DnasSearch"]
