"""A real control plane (`llmgw server`), simulators and gateways, for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A control plane with default settings."""
    c = Cluster(tmp_path)
    yield c
    c.stop()
