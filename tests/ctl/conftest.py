"""A running control plane per test (SQLite in the test's tmp dir)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.control_plane import Server, start_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """`llmgw server` with its default SQLite store in a fresh data dir."""
    srv = start_server(tmp_path)
    with srv.proc:
        yield srv
