"""The Database seam behaves the same on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.store import Database, StoreError, connect, migrate
from llmgw.store.db import Conflict, safe_url
from llmgw.store.sqlite import PAGE_SIZE
from tests.support.store import with_db


def test_placeholders_transactions_and_conflicts(store_url: str) -> None:
    async def body(db: Database) -> None:
        await db.script("CREATE TABLE t (id TEXT PRIMARY KEY, n BIGINT NOT NULL);")
        assert await db.execute("INSERT INTO t (id, n) VALUES ($1, $2)", "a", 1) == 1
        # $2 used before $1 and twice: both backends bind by number, not by order.
        await db.execute("INSERT INTO t (n, id) VALUES (CAST($2 AS BIGINT) + CAST($2 AS BIGINT), $1)", "b", 2)
        assert await db.fetchval("SELECT n FROM t WHERE id = $1", "b") == 4
        await db.executemany("INSERT INTO t (id, n) VALUES ($1, $2)", [("c", 5), ("d", 6)])
        with pytest.raises(Conflict):
            await db.execute("INSERT INTO t (id, n) VALUES ($1, $2)", "a", 9)
        with pytest.raises(RuntimeError):
            async with db.transaction() as tx:
                await tx.execute("UPDATE t SET n = 100 WHERE id = $1", "a")
                raise RuntimeError("roll back")
        assert await db.fetchval("SELECT n FROM t WHERE id = $1", "a") == 1
        async with db.transaction() as tx:
            assert await tx.execute("UPDATE t SET n = n + 1") == 4
        rows = await db.fetch("SELECT id, n FROM t ORDER BY id")
        assert [(r["id"], r[1]) for r in rows] == [("a", 2), ("b", 5), ("c", 6), ("d", 7)]
        assert await db.fetchrow("SELECT id FROM t WHERE id = $1", "zz") is None

    with_db(store_url, body)


def test_run_transaction_commits_rolls_back_and_refuses_what_cannot_run_inline(store_url: str) -> None:
    async def body(db: Database) -> None:
        await db.script("CREATE TABLE t (id TEXT PRIMARY KEY, n BIGINT NOT NULL);")

        async def add(tx: Database) -> int:
            await tx.execute("INSERT INTO t (id, n) VALUES ($1, $2)", "a", 1)
            return int(await tx.fetchval("SELECT COUNT(*) FROM t"))

        assert await db.run_transaction(add) == 1

        async def duplicate(tx: Database) -> str:
            with pytest.raises(Conflict):  # the store's own error, inside the body as outside
                await tx.execute("INSERT INTO t (id, n) VALUES ($1, $2)", "a", 2)
            return "refused"

        assert await db.run_transaction(duplicate) == "refused"

        async def fail(tx: Database) -> None:
            await tx.execute("UPDATE t SET n = 100")
            raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            await db.run_transaction(fail)
        assert await db.fetchval("SELECT n FROM t WHERE id = $1", "a") == 1

        async def waits(tx: Database) -> None:
            await tx.execute("UPDATE t SET n = 100")
            await asyncio.sleep(0)  # not a statement: SQLite's thread cannot wait for it

        if db.dialect == "sqlite":
            with pytest.raises(StoreError, match="use transaction"):
                await db.run_transaction(waits)
        else:
            await db.run_transaction(waits)
            await db.execute("UPDATE t SET n = 1")
        assert await db.fetchval("SELECT n FROM t WHERE id = $1", "a") == 1
        async with db.transaction() as tx:
            with pytest.raises(StoreError, match="already open"):
                await tx.run_transaction(fail)

    with_db(store_url, body)


def test_a_new_sqlite_store_has_large_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    import sqlite3

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:  # as a store made before 16 KiB pages
        conn.execute("CREATE TABLE kept (x TEXT)")
        conn.execute("INSERT INTO kept VALUES ('x')")
    conn.close()

    async def check() -> None:
        for path, size in ((tmp_path / "new.db", PAGE_SIZE), (old, 4096)):
            db = await connect(f"sqlite:///{path}")
            try:
                await migrate(db)
                assert await db.fetchval("PRAGMA page_size") == size
                assert await db.fetchval("PRAGMA journal_mode") == "wal"
            finally:
                await db.close()
        db = await connect(f"sqlite:///{old}")
        try:
            assert await db.fetchval("SELECT x FROM kept") == "x"
        finally:
            await db.close()

    asyncio.run(check())


def test_migrations_apply_once(store_url: str) -> None:
    async def body(db: Database) -> None:
        # with_db applied them already; a second start applies nothing.
        assert await migrate(db) == []
        versions = [r[0] for r in await db.fetch("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == sorted(versions)

    with_db(store_url, body)


def test_bad_urls_say_what_to_do() -> None:
    import asyncio

    with pytest.raises(StoreError, match="neither sqlite"):
        asyncio.run(connect("mysql://x"))
    with pytest.raises(StoreError, match=r"cannot connect to PostgreSQL at postgresql://u:\*\*\*\*@127.0.0.1:1/x"):
        asyncio.run(connect("postgresql://u:hunter2@127.0.0.1:1/x"))
    assert safe_url("postgresql://u:pw@h/db") == "postgresql://u:****@h/db"


def test_insert_values_lands_every_row_of_an_uneven_batch_in_and_out_of_a_transaction(tmp_path: Path) -> None:
    """SQLite's multi-row inserts go in power-of-two statements: 1,234 rows is 512+512+128+
    64+16+2, and every row lands once, with the tail (an upsert) applied to each."""

    async def body(db: Database) -> None:
        await db.script("CREATE TABLE v (id BIGINT PRIMARY KEY, n BIGINT NOT NULL);")
        rows = [(i, i) for i in range(1234)]
        await db.insert_values("INSERT INTO v (id, n)", rows)
        async with db.transaction() as tx:
            await tx.insert_values("INSERT INTO v (id, n)", [(i, 1) for i in range(0, 1234, 2)],
                                   "ON CONFLICT (id) DO UPDATE SET n = v.n + excluded.n")
        assert await db.fetchval("SELECT COUNT(*) FROM v") == 1234
        assert await db.fetchval("SELECT SUM(n) FROM v") == sum(range(1234)) + 617

    with_db(f"sqlite:///{tmp_path}/v.db", body)
