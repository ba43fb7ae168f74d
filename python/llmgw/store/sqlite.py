"""The embedded backend: one SQLite file, one connection, one thread.

sqlite3 blocks, so every statement runs on a single dedicated thread; the event
loop never waits on the disk. One connection means statements are serialized
anyway, so a transaction holds an asyncio lock for its whole length: without it
another coroutine's statement would land inside someone else's transaction.
Each hand-off to that thread wakes both threads, which costs more CPU than most
statements; `run_transaction` runs a whole transaction on the thread in one.
WAL mode lets readers in other processes (backups, `sqlite3` by hand) see a
consistent file while the control plane writes.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from .db import Conflict, Database, Row, StoreError

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"\$(\d+)")

PAGE_SIZE = 16384
"""Bytes per page of a store this backend creates."""


def _sql(sql: str) -> str:
    # `$n` and SQLite's `?n` bind identically by position; rewriting keeps one
    # text of every query for both backends.
    return _PLACEHOLDER.sub(r"?\1", sql) if "$" in sql else sql


# Rows per statement of `insert_values` at most: past a few hundred a larger statement
# saves nothing more, and its text (and sqlite3's compiled copy) grows with it.
_VALUES_ROWS = 512


@functools.lru_cache(maxsize=64)
def _values_sql(head: str, width: int, n: int, tail: str) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return f"{head} VALUES {', '.join([one] * n)} {tail}"


def _insert_values(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[Any]], tail: str) -> int:
    if not rows:
        return 0
    changed = 0
    width = len(rows[0])
    most = max(1, min(_VALUES_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width))
    i = 0
    while i < len(rows):
        # Statements of a power of two rows: any batch uses at most ten shapes per table,
        # so the texts here and sqlite3's cache of compiled statements stay a few, where a
        # shape per remainder would keep up to 128 statements of thousands of parameters.
        n = 1 << (min(most, len(rows) - i).bit_length() - 1)
        changed += conn.execute(_values_sql(head, width, n, tail),
                                list(itertools.chain.from_iterable(rows[i:i + n]))).rowcount
        i += n
    return changed


def file_of(url: str) -> str:
    """The file a `sqlite:` url names (`:memory:` for the in-memory store, '' for none)."""
    # sqlite:///abs/file.db -> /abs/file.db; sqlite://:memory: -> :memory:
    path = url.removeprefix("sqlite:").removeprefix("//")
    if path in (":memory:", "/:memory:"):
        return ":memory:"
    # sqlite:////abs/file.db (a template's sqlite:/// + an absolute path): one slash.
    return "/" + path.lstrip("/") if path.startswith("//") else path


class SqliteDatabase:
    """A `Database` over one SQLite file."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, url: str, conn: sqlite3.Connection, pool: ThreadPoolExecutor) -> None:
        self.url = url
        self._conn = conn
        self._pool = pool
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str) -> SqliteDatabase:
        """Opens (creating when absent) the file named by `sqlite:///PATH` or `sqlite://:memory:`."""
        path = file_of(url)
        if not path:
            raise StoreError(f"store url {url!r} names no file; use sqlite:///PATH/llmgw.db")
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-sqlite")
        loop = asyncio.get_running_loop()

        def connect() -> sqlite3.Connection:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we write BEGIN/COMMIT ourselves, so sqlite3's
            # implicit transactions never surprise us.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                # A new store, before its first page: 16 KiB pages. Usage posts are most of
                # what it writes, and WAL writes a page in two system calls; a quarter of the
                # calls took a tenth off ingesting each request. A store made with another
                # size keeps it (changing it needs a VACUUM).
                conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode is durable across a process crash; only a power loss
            # can lose the last commits, which is the trade every embedded store makes.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=5000")
            return conn

        try:
            conn = await loop.run_in_executor(pool, connect)
        except sqlite3.Error as e:
            pool.shutdown(wait=False)
            raise StoreError(f"cannot open the SQLite store {path}: {e}; check the directory exists "
                             "and is writable by this user") from e
        return cls(url, conn, pool)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except sqlite3.Error as e:
            raise _store_error(e) from e

    async def _locked(self, fn: Callable[[], T]) -> T:
        async with self._lock:
            return await self._run(fn)

    # The statement methods below are used both directly (taking the lock) and by
    # a transaction (which already holds it); `_Tx` passes `_run` instead.
    async def execute(self, sql: str, *args: Any) -> int:
        """Runs one statement; returns the number of rows it changed."""
        return await self._locked(lambda: self._conn.execute(_sql(sql), args).rowcount)

    async def _atomically(self, fn: Callable[[sqlite3.Connection], T], begin: str = "BEGIN") -> T:
        """Runs `fn(conn)` on the store's thread inside BEGIN .. COMMIT (ROLLBACK if it raises)."""
        conn = self._conn

        def run() -> T:
            conn.execute(begin)
            try:
                out = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return out

        return await self._locked(run)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Runs a statement per row, all inside one transaction."""
        batch = list(rows)
        await self._atomically(lambda conn: conn.executemany(_sql(sql), batch))

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """All of `rows` in multi-row statements, inside one transaction; returns the rows written."""
        batch = list(rows)
        return await self._atomically(lambda conn: _insert_values(conn, head, batch, tail))

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """All rows of a query."""
        return await self._locked(lambda: self._conn.execute(_sql(sql), args).fetchall())

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row, or None."""
        row: Row | None = await self._locked(lambda: self._conn.execute(_sql(sql), args).fetchone())
        return row

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]

    async def script(self, sql: str) -> None:
        """Runs several statements (no parameters) inside one transaction."""

        def run(conn: sqlite3.Connection) -> None:
            for stmt in _statements(sql):
                conn.execute(stmt)

        await self._atomically(run)

    async def copy_records(
        self, table: str, columns: Sequence[str], records: Iterable[Sequence[Any]]
    ) -> int:
        """PostgreSQL only; SQLite's `executemany` is already one C loop without round trips."""
        raise StoreError(f"copy_records into {table} is PostgreSQL only; use executemany on SQLite")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """BEGIN IMMEDIATE ... COMMIT, holding the connection for the whole block."""
        async with self._lock:
            # IMMEDIATE takes the write lock at once, so a transaction that reads
            # then writes cannot fail half-way on a lock another process holds.
            await self._run(lambda: self._conn.execute("BEGIN IMMEDIATE"))
            try:
                yield _Tx(self)
            except BaseException:
                await self._run(lambda: self._conn.execute("ROLLBACK"))
                raise
            await self._run(lambda: self._conn.execute("COMMIT"))

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """`await fn(tx)` in one BEGIN IMMEDIATE .. COMMIT, all of it on the store's thread."""
        return await self._atomically(lambda _: _drive(fn(_Tx(self, _here))), "BEGIN IMMEDIATE")

    async def close(self) -> None:
        """Closes the connection and stops its thread."""
        async with self._lock:
            await self._run(self._conn.close)
        self._pool.shutdown(wait=True)


class _Runner(Protocol):
    """How a transaction's statement reaches the connection: `SqliteDatabase._run` or `_here`."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


def _store_error(e: sqlite3.Error) -> StoreError:
    if isinstance(e, sqlite3.IntegrityError):
        return Conflict(str(e))
    return StoreError(f"SQLite store: {e}")


async def _here(fn: Callable[[], T]) -> T:
    """Runs a statement where the caller is: on the store's thread, in `run_transaction`."""
    try:
        return fn()
    except sqlite3.Error as e:
        raise _store_error(e) from e


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (it awaits only `_here` statements)."""
    try:
        coro.send(None)
    except StopIteration as done:
        out: T = done.value
        return out
    coro.close()
    raise StoreError("a run_transaction body awaited something other than its statements, which "
                     "the SQLite store's thread cannot wait for; use transaction() for it")


class _Tx:
    """The `Database` seen inside a SQLite transaction: statements run without taking the lock,
    each handed to the store's thread (`transaction()`) or run on it (`run_transaction`)."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, db: SqliteDatabase, run: _Runner | None = None) -> None:
        self._db = db
        self._run: _Runner = db._run if run is None else run
        self.url = db.url

    async def execute(self, sql: str, *args: Any) -> int:
        """Runs one statement; returns the number of rows it changed."""
        conn = self._db._conn
        return await self._run(lambda: conn.execute(_sql(sql), args).rowcount)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Runs a statement per row."""
        conn, batch = self._db._conn, list(rows)
        await self._run(lambda: conn.executemany(_sql(sql), batch))

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """All of `rows` in multi-row statements; returns the rows written."""
        conn, batch = self._db._conn, list(rows)
        return await self._run(lambda: _insert_values(conn, head, batch, tail))

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """All rows of a query."""
        conn = self._db._conn
        return await self._run(lambda: conn.execute(_sql(sql), args).fetchall())

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row, or None."""
        conn = self._db._conn
        row: Row | None = await self._run(lambda: conn.execute(_sql(sql), args).fetchone())
        return row

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]

    async def script(self, sql: str) -> None:
        """Runs several statements inside the current transaction."""
        conn = self._db._conn

        def run() -> None:
            for stmt in _statements(sql):
                conn.execute(stmt)

        await self._run(run)

    async def copy_records(
        self, table: str, columns: Sequence[str], records: Iterable[Sequence[Any]]
    ) -> int:
        """PostgreSQL only; SQLite's `executemany` is already one C loop without round trips."""
        raise StoreError(f"copy_records into {table} is PostgreSQL only; use executemany on SQLite")

    def transaction(self) -> Any:
        """Nested transactions are not supported: one block owns the connection."""
        raise StoreError("a transaction is already open on this connection; nest the work in it")

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """Nested transactions are not supported: one block owns the connection."""
        raise StoreError("a transaction is already open on this connection; nest the work in it")

    async def close(self) -> None:
        """A transaction's view cannot close the store."""
        raise StoreError("close the store, not a transaction")


def _statements(sql: str) -> list[str]:
    """Splits a migration script at `;` line ends (our files put each statement's `;` last on a line)."""
    out, cur = [], []
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        cur.append(line)
        if line.rstrip().endswith(";"):
            stmt = "\n".join(cur).strip()
            if stmt.rstrip(";").strip():
                out.append(stmt)
            cur = []
    rest = "\n".join(cur).strip()
    if rest:
        out.append(rest)
    return out
