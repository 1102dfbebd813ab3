"""Fixtures of the supernet tests: the tiny feature spec of the space tests."""

from __future__ import annotations

import pytest

from rankitect.data.spec import FeatureSpec
from rankitect.space.testing import tiny_spec


@pytest.fixture
def spec() -> FeatureSpec:
    return tiny_spec()
