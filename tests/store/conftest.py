"""Every store test runs twice: against a fresh SQLite file and a fresh PostgreSQL database.

PostgreSQL is the machine's server (127.0.0.1:5432, trust auth; `.ci/run` starts
it when it is down), or LLMGW_TEST_PG. Each test gets its own database, dropped
afterwards, so tests never see each other's rows. A PostgreSQL that does not
answer fails the test: the suite must not quietly run on SQLite alone.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

PG_ADMIN = os.environ.get("LLMGW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _pg(sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def fresh_pg_database() -> str:
    """Creates an empty database on the test server; returns its url."""
    name = "llmgw_t_" + secrets.token_hex(6)
    try:
        _pg(f'CREATE DATABASE "{name}"')
    except OSError as e:
        pytest.fail(f"PostgreSQL at {PG_ADMIN} is not answering ({e}); start it "
                    "(pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)")
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_pg_database(url: str) -> None:
    """Drops a database made by fresh_pg_database, even with connections left open."""
    name = url.rsplit("/", 1)[1]
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
