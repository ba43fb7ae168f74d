"""Fixtures of the fleet tests: a control plane with agents (`Fleet`), and two control planes
on one PostgreSQL (`Pair`); the classes are in tests/support/fleet.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import SIM_MODEL, Fleet, Pair
from tests.support.pg import drop_pg_database, fresh_pg_database


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


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """A `Pair` on a fresh PostgreSQL database; everything it started stops at the end."""
    url = fresh_pg_database()
    p = Pair(tmp_path, url)
    try:
        yield p
    finally:
        p.stop()
        drop_pg_database(url)
