"""Every store test runs twice: against a fresh SQLite file and a fresh PostgreSQL database.

PostgreSQL is the machine's server (127.0.0.1:5432, trust auth; `.ci/run` starts
it when it is down), or LLMGW_TEST_PG. Each test gets its own database, dropped
afterwards, so tests never see each other's rows. A PostgreSQL that does not
answer fails the test: the suite must not quietly run on SQLite alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pg import drop_pg_database, fresh_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The url of an empty store, once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/llmgw.db"
        return
    url = fresh_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)
