"""The `Database` seam that SQLite and PostgreSQL both implement.

Queries are written once, in PostgreSQL's `$1, $2` placeholder style; the
SQLite backend rewrites them to its numbered `?1, ?2` form, which binds the
same way. Values always travel as parameters, never inside the SQL text.
Portable types only: TEXT ids, BIGINT counts, DOUBLE PRECISION times (unix
seconds), INTEGER 0/1 flags, JSON as TEXT.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol, TypeVar

T = TypeVar("T")


class StoreError(Exception):
    """The store cannot be reached or refused an operation; the message is for the operator."""


class Row(Protocol):
    """A result row: by column name or by position (sqlite3.Row and asyncpg.Record both are)."""

    def __getitem__(self, key: str | int, /) -> Any: ...

    def keys(self) -> Iterable[str]: ...


class Conflict(StoreError):
    """A uniqueness or foreign-key rule refused a write (a name taken, a parent missing)."""


class Database(Protocol):
    """An open store. Every method takes SQL with `$n` placeholders and its arguments."""

    dialect: Literal["sqlite", "postgres"]
    url: str
    """Where it is, with any password removed: safe to print."""

    async def execute(self, sql: str, *args: Any) -> int:
        """Runs one statement; returns the number of rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Runs one statement once per row of arguments, in one round trip where possible."""
        ...

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """All rows of a query."""
        ...

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row of a query, or None."""
        ...

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        ...

    async def script(self, sql: str) -> None:
        """Runs several `;`-separated statements without parameters (migrations)."""
        ...

    async def copy_records(
        self, table: str, columns: Sequence[str], records: Iterable[Sequence[Any]]
    ) -> int:
        """PostgreSQL only: appends `records` (tuples in `columns` order) to `table` with one
        binary COPY; returns how many. Inside a transaction it is part of it, so a temporary
        table filled here can feed an `INSERT .. SELECT` next. SQLite raises StoreError:
        callers check `dialect` first (its `executemany` is already one C loop)."""
        ...

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """SQLite only: `{head} VALUES (..), (..), .. {tail}` for all of `rows` (each as wide
        as the columns `head` names), in as few statements as SQLite's limit on parameters
        allows. One statement steps once for hundreds of rows where `executemany` steps (and
        hands Python's lock back and forth) once per row. PostgreSQL raises StoreError:
        callers check `dialect` first (there, `copy_records`). Returns the rows written (not
        those an `ON CONFLICT DO NOTHING` tail skipped)."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Database]:
        """A transaction: the `Database` it yields runs every statement inside it; leaving the
        block commits, an exception rolls back. Other callers wait until it ends (SQLite) or
        use other connections (PostgreSQL)."""
        ...

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """`await fn(tx)` inside `transaction()`; returns what it returns. On SQLite all of `fn`
        runs on the store's thread in one hand-off, where a `transaction()` block hands off once
        per statement (a wake-up of both threads each: about 0.2 ms of CPU on a small VM), so
        `fn` must await nothing but `tx`'s statements (anything else raises StoreError). For
        hot paths of many statements: usage ingestion."""
        ...

    async def close(self) -> None:
        """Closes every connection."""
        ...


async def connect(url: str) -> Database:
    """Opens the store at `url`: `sqlite:///path/to/file.db`, `sqlite://:memory:`, or
    `postgresql://user@host:port/db`. Raises StoreError with what to do when it cannot."""
    if url.startswith("sqlite:"):
        from .sqlite import SqliteDatabase

        return await SqliteDatabase.open(url)
    if url.startswith(("postgresql:", "postgres:")):
        from .postgres import PostgresDatabase

        return await PostgresDatabase.open(url)
    raise StoreError(
        f"store url {safe_url(url)!r} is neither sqlite:///PATH nor postgresql://...; "
        "give one of those (sqlite:///var/lib/llmgw/llmgw.db is the embedded default)"
    )


def safe_url(url: str) -> str:
    """The url with any password replaced by ****."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    cred, _, host = rest.rpartition("@")
    user, colon, _ = cred.partition(":")
    return f"{scheme}://{user}{':****' if colon else ''}@{host}"


async def update_row(tx: Database, table: str, row_id: str, sets: dict[str, Any]) -> None:
    """UPDATE table SET col = $n, ... WHERE id = $1 for the given columns; nothing when empty.

    Table and column names come from code, never from callers' input; values are parameters."""
    if not sets:
        return
    cols = ", ".join(f"{col} = ${i}" for i, col in enumerate(sets, start=2))
    await tx.execute(f"UPDATE {table} SET {cols} WHERE id = $1", row_id, *sets.values())
