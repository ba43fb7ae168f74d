"""A real control plane with a fleet: `llmgw server` with models in its server.yaml, and agents
with simulated GPUs that start real simulator engines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import SIM_MODEL, Fleet


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    """Makes a `Fleet`; everything it started stops at the end."""
    made: list[Fleet] = []

    def make(models: list[dict[str, Any]] | None = None, **settings: Any) -> Fleet:
        f = Fleet(tmp_path, [SIM_MODEL] if models is None else models, **settings)
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()
