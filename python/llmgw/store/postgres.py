"""The production backend: PostgreSQL through an asyncpg connection pool.

Several control planes can share one database (issue: control plane HA), so
nothing here assumes it is the only writer: migrations take an advisory lock,
and every write that could race is an upsert or a conditional update.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import asyncpg

from .db import Conflict, Database, Row, StoreError, safe_url

T = TypeVar("T")

_INTEGRITY = (asyncpg.UniqueViolationError, asyncpg.ForeignKeyViolationError,
              asyncpg.NotNullViolationError, asyncpg.CheckViolationError)
_UNREACHABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
"""What asyncpg raises when the server is gone: a refused or reset connection, a lost one."""


def _count(status: str) -> int:
    # asyncpg answers "UPDATE 3", "INSERT 0 1", "DELETE 0": the last word is the count.
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


class PostgresDatabase:
    """A `Database` over an asyncpg pool."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, url: str, pool: asyncpg.Pool) -> None:
        self.url = safe_url(url)
        self._pool = pool

    @classmethod
    async def open(cls, url: str, min_size: int = 1, max_size: int = 10) -> PostgresDatabase:
        """Connects a pool; raises StoreError naming the server (never the password)."""
        try:
            pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size,
                                             command_timeout=30)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise StoreError(f"cannot connect to PostgreSQL at {safe_url(url)}: {e}; check the server "
                             "is running and the url's user, host, port and database") from e
        return cls(url, pool)

    async def execute(self, sql: str, *args: Any) -> int:
        """Runs one statement; returns the number of rows it changed."""
        async with self._connection() as conn:
            return await _Conn(conn, self.url).execute(sql, *args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """asyncpg pipelines the rows in one transaction."""
        async with self._connection() as conn:
            await _Conn(conn, self.url).executemany(sql, rows)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """All rows of a query."""
        async with self._connection() as conn:
            return await _Conn(conn, self.url).fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row, or None."""
        async with self._connection() as conn:
            return await _Conn(conn, self.url).fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        async with self._connection() as conn:
            return await _Conn(conn, self.url).fetchval(sql, *args)

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """SQLite only; on PostgreSQL, `copy_records` (or `executemany`) lands many rows."""
        raise StoreError("insert_values is SQLite only; use copy_records or executemany on PostgreSQL")

    async def copy_records(
        self, table: str, columns: Sequence[str], records: Iterable[Sequence[Any]]
    ) -> int:
        """One binary COPY into `table` on a pooled connection."""
        async with self._connection() as conn:
            return await _Conn(conn, self.url).copy_records(table, columns, records)

    async def script(self, sql: str) -> None:
        """Runs several statements in one transaction."""
        async with self.transaction() as tx:
            await tx.script(sql)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """One pooled connection inside BEGIN ... COMMIT (ROLLBACK on an exception)."""
        async with self._connection() as conn:
            try:
                async with conn.transaction():
                    yield _Conn(conn, self.url)
            except _INTEGRITY as e:  # a deferred check failing at COMMIT
                raise Conflict(str(e)) from e
            except _UNREACHABLE as e:
                if isinstance(e.__context__, StoreError):
                    # A statement failed and took the session with it (the server ended it, e.g.
                    # an idle-in-transaction timeout): the ROLLBACK could not be sent and need not
                    # be; the statement's error is the one that says why.
                    raise e.__context__ from None
                # BEGIN or COMMIT on a connection the server dropped; the statements inside
                # already answer StoreError through _Conn.
                raise StoreError(f"PostgreSQL store: {e}") from e

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """`await fn(tx)` in one transaction (its statements are round trips either way)."""
        async with self.transaction() as tx:
            return await fn(tx)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """A pooled connection. The pool opens a new one when the server dropped the last:
        a server that cannot be reached then must be a StoreError like a failed statement,
        which callers turn into a 503 or a retry, not an unexpected OSError (a 500, or a
        background loop that dies)."""
        try:
            conn = await self._pool.acquire()
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: cannot connect to {self.url}: {e}") from e
        try:
            yield conn
        finally:
            await self._pool.release(conn)

    async def close(self) -> None:
        """Closes the pool."""
        await self._pool.close()


class _Conn:
    """One connection, used for a single statement or a whole transaction."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, conn: Any, url: str) -> None:
        self._conn = conn
        self.url = url

    async def execute(self, sql: str, *args: Any) -> int:
        """Runs one statement; returns the number of rows it changed."""
        try:
            return _count(await self._conn.execute(sql, *args))
        except _INTEGRITY as e:
            raise Conflict(str(e)) from e
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: {e}") from e

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Runs a statement per row."""
        try:
            await self._conn.executemany(sql, list(rows))
        except _INTEGRITY as e:
            raise Conflict(str(e)) from e
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: {e}") from e

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """All rows of a query."""
        try:
            rows: list[Row] = await self._conn.fetch(sql, *args)
            return rows
        except _INTEGRITY as e:
            raise Conflict(str(e)) from e
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: {e}") from e

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row, or None."""
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """SQLite only; on PostgreSQL, `copy_records` (or `executemany`) lands many rows."""
        raise StoreError("insert_values is SQLite only; use copy_records or executemany on PostgreSQL")

    async def copy_records(
        self, table: str, columns: Sequence[str], records: Iterable[Sequence[Any]]
    ) -> int:
        """One binary COPY into `table`: values are encoded by asyncpg's codecs in C and parsed
        by the server without text conversion, the cheapest way to land many rows."""
        try:
            status = await self._conn.copy_records_to_table(
                table, records=records, columns=list(columns)
            )
        except _INTEGRITY as e:
            raise Conflict(str(e)) from e
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: {e}") from e
        return _count(status)

    async def script(self, sql: str) -> None:
        """Several statements at once (asyncpg's simple query protocol takes them together)."""
        try:
            await self._conn.execute(sql)
        except _UNREACHABLE as e:
            raise StoreError(f"PostgreSQL store: {e}") from e

    def transaction(self) -> Any:
        """Nested transactions are not supported."""
        raise StoreError("a transaction is already open on this connection; nest the work in it")

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """Nested transactions are not supported."""
        raise StoreError("a transaction is already open on this connection; nest the work in it")

    async def close(self) -> None:
        """A transaction's view cannot close the store."""
        raise StoreError("close the store, not a transaction")
