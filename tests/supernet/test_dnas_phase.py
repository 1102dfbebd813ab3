"""The DNAS phase: expected FLOPs against the analytic cost, the penalty's pull, the estimators'
gradients against their formulas, targets met, determinism, when it stops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.config import DnasConfig, SupernetConfig, TrainConfig
from rankitect.data.store import ClickData
from rankitect.eval.objective import Objective
from rankitect.space import cost, get_space
from rankitect.space.testing import tiny_spec
from rankitect.supernet.dnas_phase import Stability, auto_epochs, dnas_schedule, dnas_search
from rankitect.supernet.dnas_step import ArchStep
from rankitect.supernet.dnas_weights import ArchitectureWeights, ExpectedFlops
from rankitect.supernet.model import Supernet
from rankitect.supernet.train import SupernetTrainer, build_supernet
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_NASREC, small_space

TRAIN = TrainConfig(batch_size=64, progress=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ClickData:
    return tiny_click_data(tmp_path_factory.mktemp("dnas") / "data", rows=1024)


def three_slots():
    # Wiring and widths only: where a penalty lands on three slots (recipe labels: the engineer cases).
    return get_space("nasrec", **{**SMALL_NASREC, "num_blocks": 3}, recipe={})


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_expected_flops_of_a_one_hot_is_the_analytic_cost(preset: str) -> None:
    space, spec = small_space(preset), tiny_spec()
    expected, weights = ExpectedFlops(Supernet(space, spec)), ArchitectureWeights(space)
    rng = np.random.default_rng(3)
    for _ in range(20):
        path = space.sample(rng)
        assert float(expected(weights.one_hot(path))) == cost(space.decode(path), spec).flops


def test_expected_flops_over_one_label_is_sum_p_c() -> None:
    space, spec = three_slots(), tiny_spec()
    path = space.sample(np.random.default_rng(0))
    probs = ArchitectureWeights(space).one_hot(path)
    p = torch.tensor([0.2, 0.5, 0.3])
    probs["b2.width"] = p
    by_hand = sum(float(pi) * cost(space.decode({**path, "b2.width": w}), spec).flops
                  for pi, w in zip(p, space.choices["b2.width"].options))
    assert float(ExpectedFlops(Supernet(space, spec))(probs)) == pytest.approx(by_hand, rel=1e-6)


def test_penalty_gradient_moves_probability_to_cheaper_options() -> None:
    space, spec = three_slots(), tiny_spec()
    supernet, weights = Supernet(space, spec), ArchitectureWeights(space)
    expected = ExpectedFlops(supernet)
    at = weights.argmax()
    label = "b0.width"
    costs = [supernet.path_flops({**at, label: w}) for w in space.choices[label].options]
    assert costs == sorted(costs) and costs[0] < costs[-1]  # widths are listed cheapest first
    before = weights.probs()[label].detach().clone()
    expected(weights.probs()).backward()
    grad = weights.logits[list(space.choices).index(label)].grad
    assert torch.all(grad[1:] > grad[:-1])  # the costlier the option, the more the penalty pushes it down
    with torch.no_grad():
        for a in weights.arch_parameters():
            if a.grad is not None:  # inactive labels cost nothing either way
                a -= 1e-4 * a.grad / max(float(a.grad.abs().max()), 1e-12)
    after = weights.probs()[label]
    assert after[0] > before[0] and after[-1] < before[-1]


def test_objective_of_a_sample_pulls_towards_a_relaxed_target(data: ClickData) -> None:
    space = three_slots()
    supernet, weights = Supernet(space, data.spec), ArchitectureWeights(space)
    path = supernet.widest_path(np.random.default_rng(0))
    target = supernet.path_flops(path) / 2e6  # the sample is twice the target
    with torch.no_grad():  # the most probable architecture is the widest one as well
        for label, a in zip(weights.labels, weights.arch_parameters()):
            a[space.choices[label].index(path[label])] = 1.0
    step = ArchStep(supernet, weights, torch.optim.SGD(weights.arch_parameters(), lr=0.1),
                    SupernetTrainer(supernet, TRAIN, data.split("train").ctr), ExpectedFlops(supernet),
                    Objective(target_mflops=target, penalty="relaxed", weight=1.0))
    ne = torch.tensor(0.9)
    value = step.objective_of(ne, 2 * target)
    assert float(value) == pytest.approx(0.9 * (1 + 1.0 * 1.0))  # NE (1 + weight log2(F / F0)), exact for the sample
    value.backward()
    grad = weights.logits[list(space.choices).index("b2.width")].grad
    assert torch.all(grad[1:] > grad[:-1])


def test_one_forward_step_trains_the_weights_as_a_plain_step_and_moves_the_architecture(data: ClickData) -> None:
    space = three_slots()
    plain, joint = build_supernet(space, data.spec, 0), build_supernet(space, data.spec, 0)
    for net in (plain, joint):  # the output layers start at zero, where no gradient reaches a gate
        with torch.random.fork_rng():
            torch.manual_seed(1)
            for p in net.head.parameters():
                torch.nn.init.normal_(p, std=0.1)
    batch = next(iter(data.split("train").batches(64, shuffle=False)))
    weights = ArchitectureWeights(space)
    path, relaxed = weights.gumbel(torch.Generator().manual_seed(0), 1.0)
    gates = {label: w[space.choices[label].index(path[label])] for label, w in relaxed.items()}
    ctr = data.split("train").ctr
    SupernetTrainer(plain, TRAIN, ctr).step(batch, path)
    SupernetTrainer(joint, TRAIN, ctr).step(batch, path, gates=gates, objective=lambda loss: 3.7 * loss)
    for (name, a), b in zip(plain.named_parameters(), joint.parameters()):
        keep = torch.ones_like(a, dtype=torch.bool)
        if name.endswith("qkv.bias"):
            # The key bias's gradient is zero in exact arithmetic (softmax ignores a constant added to
            # a row of scores), so it holds float rounding, which Adam scales up to a full step.
            third = a.numel() // 3
            keep[third:2 * third] = False
        assert torch.allclose(a[keep], b[keep], atol=1e-6), name  # the objective's factor does not reach the weights
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in weights.arch_parameters())


def run_dnas(
    data: ClickData, objective: Objective, seed: int = 0, steps: int = 60, space=None, estimator: str = "gumbel",
) -> tuple[Supernet, ArchitectureWeights]:
    supernet = build_supernet(space or three_slots(), data.spec, seed)
    # every step run: these tests check where a fixed number of steps leads, not when to stop
    cfg = DnasConfig(supernet=SupernetConfig(steps=steps, epochs=1e6), weights_only_steps=5, arch_lr=0.3,
                     stable_steps=0, estimator=estimator)
    return supernet, dnas_search(supernet, data, TRAIN, cfg, objective, seed=seed)


def median_cost(space, spec) -> float:
    supernet = Supernet(space, spec)
    return float(np.median([supernet.path_flops(space.sample(np.random.default_rng(i))) for i in range(100)]))


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gumbel", "reinforce"])
@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_large_absolute_penalty_lands_within_ten_percent_of_the_target(data: ClickData, preset: str,
                                                                        estimator: str) -> None:
    space = three_slots() if preset == "nasrec" else small_space("engineer")
    target = median_cost(space, data.spec) / 1e6
    supernet, weights = run_dnas(data, Objective(target_mflops=target, penalty="absolute", weight=5.0), space=space,
                                 estimator=estimator, steps=60 if estimator == "gumbel" else 150)
    derived = supernet.path_flops(weights.argmax()) / 1e6
    assert abs(derived / target - 1) <= 0.10, (derived, target)


@pytest.mark.parametrize("estimator", ["gumbel", "reinforce"])
def test_large_relaxed_penalty_lands_below_the_target(data: ClickData, estimator: str) -> None:
    target = median_cost(three_slots(), data.spec) / 1e6
    supernet, weights = run_dnas(data, Objective(target_mflops=target, penalty="relaxed", weight=5.0),
                                 estimator=estimator, steps=60 if estimator == "gumbel" else 150)
    assert supernet.path_flops(weights.argmax()) / 1e6 <= target


@pytest.mark.parametrize("estimator", ["gumbel", "reinforce"])
def test_a_fixed_seed_derives_the_same_architecture(data: ClickData, estimator: str) -> None:
    objective = Objective()
    _, first = run_dnas(data, objective, seed=3, steps=20, estimator=estimator)
    _, again = run_dnas(data, objective, seed=3, steps=20, estimator=estimator)
    assert first.argmax() == again.argmax()
    for a, b in zip(first.arch_parameters(), again.arch_parameters()):
        assert torch.equal(a, b)
    assert any(not torch.all(a == 0) for a in first.arch_parameters())  # the weights did move


@pytest.mark.parametrize("train", [False, True])
def test_reinforce_step_is_the_leave_one_out_score_function_gradient(data: ClickData, train: bool) -> None:
    import copy

    space = three_slots()
    supernet = build_supernet(space, data.spec, 0)
    trainer = SupernetTrainer(supernet, TRAIN, data.split("train").ctr, max_grad_norm=1e9)  # no clipping
    scored = copy.deepcopy(supernet)  # the weights every path is scored with (before any training step)
    weights = ArchitectureWeights(space)
    with torch.no_grad():  # a distribution that is not uniform, so log p has a gradient of its own
        for a in weights.arch_parameters():
            a.copy_(torch.linspace(-0.5, 0.5, len(a)))
    before = [a.detach().clone() for a in weights.arch_parameters()]
    objective = Objective(target_mflops=0.01, penalty="relaxed", weight=0.5)
    step = ArchStep(supernet, weights, torch.optim.SGD(weights.arch_parameters(), lr=1.0), trainer,
                    ExpectedFlops(supernet), objective)
    batch = next(iter(data.split("val").batches(64, shuffle=False)))
    row = step.reinforce(batch, torch.Generator().manual_seed(0), samples=3, train=train)
    # by hand: each path's objective from a plain forward and the textbook log-loss, its advantage
    # against the mean of the other two, and d log p / d alpha = one_hot - softmax on its active labels
    values = []
    with torch.no_grad():
        for path in step.last_paths:
            p = torch.sigmoid(scored(batch, path))
            y = batch.labels
            logloss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
            ctr = data.split("train").ctr
            ne = logloss / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
            mflops = supernet.path_flops(path) / 1e6
            values.append(ne * (1 + 0.5 * max(0.0, np.log2(mflops / 0.01))))
    grad = [torch.zeros_like(b) for b in before]
    for path, value in zip(step.last_paths, values):
        advantage = value - (sum(values) - value) / 2
        for label in space.active(path):
            i = weights.labels.index(label)
            one_hot = torch.zeros_like(before[i])
            one_hot[space.choices[label].index(path[label])] = 1.0
            grad[i] += advantage * (one_hot - torch.softmax(before[i], dim=0)) / 3
    for b, a, g in zip(before, weights.arch_parameters(), grad):
        assert torch.allclose(a.detach(), b - g, atol=1e-5)  # one SGD step of rate 1 on the gradient
    assert len({space.decode(p).hash for p in step.last_paths}) > 1  # the paths did differ
    trained = any(not torch.equal(a, b) for a, b in zip(supernet.parameters(), scored.parameters()))
    assert trained == train and ("train/loss" in row) == train  # with train, the weights stepped on the first path


def test_gumbel_sample_gates_are_one_with_gradient() -> None:
    weights = ArchitectureWeights(three_slots())
    path, relaxed = weights.gumbel(torch.Generator().manual_seed(0), tau=1.0)
    for label, w in relaxed.items():
        i = three_slots().choices[label].index(path[label])
        assert float(w[i]) == pytest.approx(1.0) and float(w.sum()) == pytest.approx(1.0)
    sum(w[0] for w in relaxed.values()).backward()
    assert all(a.grad is not None and (len(a) == 1 or a.grad.abs().sum() > 0) for a in weights.arch_parameters())


def test_stability_counts_architecture_steps_without_a_change() -> None:
    space = three_slots()
    rng = np.random.default_rng(0)
    a, b = space.sample(rng), space.sample(rng)
    assert space.decode(a) != space.decode(b)
    stable = Stability(space, patience=2)
    held = [stable.update(p) for p in (a, a, b, b, b, b)]
    assert held == [False, False, False, False, True, True]  # b held over two, then three steps
    assert not any(Stability(space, patience=0).update(a) for _ in range(5))  # 0: never stops


def test_holding_the_start_never_ends_the_search() -> None:
    """Around a start path the count ends the search only once the argmax has left the start."""
    space = three_slots()
    rng = np.random.default_rng(1)
    start, b = space.sample(rng), space.sample(rng)
    stable = Stability(space, patience=2, start=start)
    held = [stable.update(p) for p in [start] * 10 + [b, b, b, start, start, start]]
    assert held == [False] * 10 + [False, False, True, False, False, True]


class _Steps:
    """A curve logger that remembers the steps it saw."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, step: int, metrics: dict) -> None:
        self.steps.append(step)


def test_search_stops_once_the_most_probable_architecture_holds(data: ClickData) -> None:
    supernet = build_supernet(three_slots(), data.spec, 0)
    curves, lines = _Steps(), []
    cfg = DnasConfig(supernet=SupernetConfig(steps=400, epochs=1e6, log_every=1000), weights_only_steps=5, arch_lr=0.3,
                     stable_steps=10)
    dnas_search(supernet, data, TRAIN, cfg, Objective(), seed=0, curves=curves, echo=lines.append)
    assert len(lines) == 1 and curves.steps[-1] < 399  # stopped early, and logged the step it stopped at
    assert f"stopped after {curves.steps[-1] + 1} of 400 steps" in lines[0]


def test_schedule_runs_at_most_the_epochs_asked() -> None:
    per_epoch = 10_000 // 64  # whole batches: the rows left over join the last one
    assert dnas_schedule(DnasConfig(supernet=SupernetConfig(steps=10**6, epochs=2.0), weights_only_steps=100),
                         10_000, 64) == (
        2 * per_epoch, 100 * 2 * per_epoch // 10**6)
    assert dnas_schedule(DnasConfig(supernet=SupernetConfig(steps=50, epochs=2.0), weights_only_steps=10),
                         10_000, 64) == (50, 10)


def test_leaning_towards_a_path_makes_its_architecture_the_most_probable() -> None:
    space = three_slots()
    path = space.sample(np.random.default_rng(5))
    weights = ArchitectureWeights(space)
    weights.lean_towards(path, 0.5)
    assert space.decode(weights.argmax()) == space.decode(path)
    probs = weights.probs()
    for label in space.active(path):
        n = len(space.choices[label].options)
        i = space.choices[label].index(path[label])
        assert float(probs[label][i]) == pytest.approx(np.exp(0.5) / (np.exp(0.5) + n - 1))  # softmax by hand


def test_auto_epochs_is_the_median_of_the_baselines_epochs_to_their_best() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows, batch = int(rng.integers(100, 10_000)), int(rng.integers(8, 512))
        per_epoch = max(1, rows // batch)  # the rows left over join the last batch
        steps = [int(s) for s in rng.integers(1, 20 * per_epoch, size=int(rng.integers(1, 7)))]
        assert auto_epochs(steps, rows, batch) == pytest.approx(max(1.0, float(np.median(np.array(steps) / per_epoch))))
    assert auto_epochs([], 1000, 10) == 1.0
