"""The one cost measure against torch's FlopCounterMode on built models, plain and ROCS, from one build."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.cost import Cost, measure
from rankitect.eval.result import TrialResult
from rankitect.serve import score_requests
from rankitect.space import BASELINES, get_baseline, get_space
from rankitect.space.builder import RankingModel, build_model
from rankitect.space.testing import tiny_batch, tiny_spec

ROWS, PER_REQUEST = 12, 3  # 4 requests of 3 candidates


def archs(rocs: bool) -> list:
    """Every baseline and a few samples of each preset, ROCS-masked or not."""
    spec = tiny_spec()
    out = [get_baseline(name, spec, embedding_dim=4) for name in BASELINES]
    rng = np.random.default_rng(0)
    for name in ("nasrec", "engineer"):
        space = get_space(name, embedding_dim=4)
        out += [space.decode(space.sample(rng)) for _ in range(3)]
    space = get_space("engineer", embedding_dim=4, max_depth=2)  # dense features as bucket fields
    sample = space.encode(space.decode(space.sample(rng)))
    out += [space.decode({**sample, "depth": 1, "L0.op": "attention", "dense.path": path, "dense.fields": "buckets"})
            for path in ("fields", "both")]
    return [dataclasses.replace(a, rocs=rocs) for a in out]


@pytest.mark.parametrize("arch", archs(rocs=False), ids=lambda a: a.hash)
def test_plain_cost_is_what_torch_counts_and_holds(arch) -> None:
    spec = tiny_spec()
    model = build_model(arch, spec)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tiny_batch(spec, ROWS, per_request=PER_REQUEST))
    c = measure(arch, spec)
    assert c.flops == pytest.approx(counter.get_total_flops() / ROWS, rel=0.01)
    assert c.params == sum(p.numel() for p in model.parameters())
    assert c.dense_params == sum(p.numel() for p in model.dense_parameters())
    assert c.served_flops == c.flops and not c.rocs and c.rocs_metrics() == {}


@pytest.mark.parametrize("arch", archs(rocs=True), ids=lambda a: a.hash)
def test_rocs_cost_is_what_torch_counts_when_scoring_requests(arch) -> None:
    spec = tiny_spec()
    model = build_model(arch, spec).eval()
    batch = tiny_batch(spec, ROWS, per_request=PER_REQUEST)
    with FlopCounterMode(display=False) as shared:
        score_requests(model, batch)
    with torch.no_grad(), FlopCounterMode(display=False) as full:
        model(batch)
    c = measure(arch, spec, candidates_per_request=PER_REQUEST)
    # Served per example: the candidate part, plus the request part shared by the request's rows.
    assert c.served_flops * ROWS == pytest.approx(shared.get_total_flops())
    assert c.flops == pytest.approx(full.get_total_flops() / ROWS, rel=0.01)
    assert c.served_flops <= c.flops
    assert c.rocs_metrics()["rocs/mflops_per_example"] == pytest.approx(c.served_mflops)
    assert c.rocs_metrics()["rocs/candidates_per_request"] == PER_REQUEST


@pytest.mark.parametrize("rocs", [False, True])
def test_one_measure_builds_the_model_once(rocs: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    init = RankingModel.__init__

    def counted(self, *args, **kwargs) -> None:
        builds.append(kwargs.get("device"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(RankingModel, "__init__", counted)
    arch = dataclasses.replace(get_baseline("dcnv2", tiny_spec(), embedding_dim=4), rocs=rocs)
    measure(arch, tiny_spec(), candidates_per_request=4.0)
    assert len(builds) == 1


def test_a_trial_result_keeps_its_cost_through_json() -> None:
    arch = dataclasses.replace(get_baseline("dlrm", tiny_spec(), embedding_dim=4), rocs=True)
    c = measure(arch, tiny_spec(), candidates_per_request=2.5)
    result = TrialResult(val_ne=0.8, mflops=c.served_mflops, params=c.params, cost=c)
    back = TrialResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result and isinstance(back.cost, Cost)
    assert TrialResult.from_dict({**result.to_dict(), "cost": None}).cost is None  # results logged before costs


def test_a_bad_fan_out_is_refused() -> None:
    with pytest.raises(ValueError, match="candidates_per_request"):
        Cost(flops=1, params=1, dense_params=1, candidates_per_request=0.0)
