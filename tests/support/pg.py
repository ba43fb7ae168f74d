"""Fresh PostgreSQL databases on the test server, one per test, dropped afterwards.

The server is the machine's (127.0.0.1:5432, trust auth; `.ci/run` starts it when it is
down), or LLMGW_TEST_PG. A PostgreSQL that does not answer fails the test: the suite must
not quietly run on SQLite alone.
"""

from __future__ import annotations

import asyncio
import os
import secrets

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
