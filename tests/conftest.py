"""Suite-wide fixtures."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """A full collection after each test, so that a connection or file a test left open is
    reported (ResourceWarning, an error here) in that test, not in whichever test happens to
    run when the collector next gets to it."""
    yield
    gc.collect()
