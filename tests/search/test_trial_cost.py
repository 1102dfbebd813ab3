"""What a search ranks a candidate by: MFLOPs per example as it would be served.

Plain architectures: the FLOPs of scoring every row in full. ROCS-masked ones: the request part
counted once per request, shared by the request's candidates (mean fan-out of the test split,
counted here by a plain loop over its request ids).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rankitect.cost import measure
from rankitect.search.running.trial import candidates_per_request
from rankitect.serve.rocs import rocs_cost
from rankitect.space import get_baseline
from rankitect.space.flops import cost

from .tiny_data import tiny_click_data


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return tiny_click_data(tmp_path_factory.mktemp("cost") / "d", rows=96)


def _fan_out(data) -> float:
    ids = [int(r) for r in data.split("test").request_ids]
    runs = 1 + sum(1 for a, b in zip(ids, ids[1:]) if a != b)
    return len(ids) / runs


def test_plain_candidates_cost_their_full_flops(data) -> None:
    arch = get_baseline("dcnv2", data.spec)
    c = cost(arch, data.spec)
    measured = measure(arch, data.spec)
    assert (measured.served_mflops, measured.params) == (c.mflops, c.params)


@pytest.mark.parametrize("share", [None, 0.75])
def test_rocs_candidates_cost_their_request_shared_flops(data, share: float | None) -> None:
    arch = dataclasses.replace(get_baseline("dcnv2", data.spec), rocs=True, rocs_share=share)
    fan_out = _fan_out(data)
    assert fan_out == pytest.approx(4.0) and candidates_per_request(data) == pytest.approx(fan_out)
    parts = rocs_cost(arch, data.spec)
    measured = measure(arch, data.spec, candidates_per_request(data))
    mflops, params = measured.served_mflops, measured.params
    assert mflops == pytest.approx((parts.per_candidate + parts.per_request / fan_out) / 1e6)
    assert params == cost(arch, data.spec).params
    assert mflops < cost(arch, data.spec).mflops  # sharing the request part is cheaper per example
