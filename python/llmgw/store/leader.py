"""The leader lease: which of several control planes on one PostgreSQL places replicas.

One row of `leader_lease`. Taking and renewing are the same single statement, an
`INSERT .. ON CONFLICT DO UPDATE .. WHERE` that succeeds only for the holder or
once the lease has expired, so two control planes racing for an expired lease
cannot both win: PostgreSQL locks the row and re-checks the condition for the
second one. Every time comes from the database's `clock_timestamp()`, never from
a control plane's clock, so a skewed machine can neither steal a live lease nor
keep one it no longer holds.

Fencing: every take by a new holder (or by the same holder after its lease
expired) moves the lease's `epoch` on. A leader writes through `Fenced`, which
runs each write in a transaction that first locks the lease row and checks that
its epoch is still current and unexpired; a leader that was paused past its TTL
and wakes with tasks that write before its lease loop runs gets `Deposed`
instead of overwriting its successor's rows. The row lock (`FOR SHARE`) makes a
takeover wait for a fenced write in flight, so the new leader, which loads the
fleet after it took the lease, sees every write the old one made. A leader
paused in the middle of such a transaction would hold that lock, and with it
every takeover, for as long as it is paused: the transaction therefore sets
`idle_in_transaction_session_timeout`, and PostgreSQL ends a fenced transaction
left idle longer than that (its writes rolled back, the lock released).

PostgreSQL only: on SQLite one control plane owns the store and needs no lease
(`llmgw.control.leader`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, TypeVar

import msgspec

from .db import Database, Row, StoreError

T = TypeVar("T")

LEASE = "control-plane"
"""The one lease's name (a column, so another lease could share the table later)."""

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"

_TAKE = f"""
INSERT INTO leader_lease AS l (name, holder, admin_url, agent_address, since, expires_at, epoch)
VALUES ($1, $2, $3, $4, {_NOW}, {_NOW} + $5, 1)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder, admin_url = excluded.admin_url,
    agent_address = excluded.agent_address,
    since = CASE WHEN l.holder = excluded.holder AND l.expires_at >= excluded.since
                 THEN l.since ELSE excluded.since END,
    expires_at = excluded.expires_at,
    epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at >= excluded.since
                 THEN l.epoch ELSE l.epoch + 1 END
WHERE l.holder = excluded.holder OR l.expires_at < excluded.since
RETURNING holder, admin_url, agent_address, since, expires_at, epoch, {_NOW} AS now
"""

_CURRENT = f"""
SELECT holder, admin_url, agent_address, since, expires_at, epoch, {_NOW} AS now
FROM leader_lease WHERE name = $1
"""

# Locks the row until the writing transaction ends: a take (an UPDATE of it) waits, but
# no longer than the transaction may stay idle ($2, e.g. '500ms'; see the module's doc).
_FENCE = f"""
SELECT epoch, expires_at > {_NOW} AS live,
       set_config('idle_in_transaction_session_timeout', $2, true) AS idle_limit
FROM leader_lease WHERE name = $1 FOR SHARE
"""


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The lease as the store holds it, with the database's clock when it was read."""

    holder: str
    """The holding control plane's id (random per process)."""
    admin_url: str
    """Where its admin API answers: standbys forward to it."""
    agent_address: str
    """HOST:PORT of its agent service: standbys send agents there."""
    since: float
    """When this holder took it (database clock, unix seconds)."""
    expires_at: float
    epoch: int = 0
    """The term: one more at each takeover (see `Fenced`)."""
    now: float
    """The database's clock at the read."""

    @property
    def live(self) -> bool:
        """Whether it had not expired at the read."""
        return self.expires_at > self.now


async def take(db: Database, holder: str, admin_url: str, agent_address: str,
               ttl: float) -> Lease | None:
    """Takes or renews the lease for `ttl` seconds; the lease when `holder` now holds it,
    None when another holder's lease has not expired."""
    row = await db.fetchrow(_TAKE, LEASE, holder, admin_url, agent_address, ttl)
    return None if row is None else _lease(row)


async def current(db: Database) -> Lease | None:
    """The lease row (live or expired), or None when no control plane ever took it."""
    row = await db.fetchrow(_CURRENT, LEASE)
    return None if row is None else _lease(row)


async def release(db: Database, holder: str) -> bool:
    """Ends `holder`'s lease now (a clean stop), so a standby takes it without waiting out
    the TTL; False when it did not hold it."""
    n = await db.execute(f"UPDATE leader_lease SET expires_at = {_NOW} - 1 "
                         "WHERE name = $1 AND holder = $2", LEASE, holder)
    return n > 0


def _lease(row: object) -> Lease:
    r: dict[str, object] = dict(row)  # type: ignore[call-overload]
    return msgspec.convert(r, Lease)


class Deposed(StoreError):
    """A fenced write refused: the lease has moved to a later epoch, or expired, since the
    writer was elected."""


class Fenced:
    """A `Database` whose writes succeed only while the lease is still at `epoch` and live.

    Reads pass through. Each write (`execute`, `executemany`, `script`, `copy_records`,
    and every statement of a `transaction()`) runs in a transaction that first checks the
    lease row (`_FENCE`); when the check fails, `on_deposed` is called and the write
    raises `Deposed` without having changed anything. A fenced transaction idle for more
    than `idle_limit` seconds (a paused process) is ended by PostgreSQL.
    """

    def __init__(self, db: Database, epoch: int, on_deposed: Callable[[str], None],
                 idle_limit: float) -> None:
        self.db = db
        self.epoch = epoch
        self.idle_limit = f"{max(1, round(idle_limit * 1000))}ms"
        self.dialect: Literal["sqlite", "postgres"] = db.dialect
        self.url = db.url
        self._on_deposed = on_deposed
        self.refused = 0
        """Writes refused so far (for tests and the log)."""

    async def _check(self, tx: Database) -> None:
        row = await tx.fetchrow(_FENCE, LEASE, self.idle_limit)
        if row is not None and row["epoch"] == self.epoch and row["live"]:
            return
        self.refused += 1
        why = ("the leader lease has no row" if row is None
               else f"the leader lease is at epoch {row['epoch']}, this leader's is {self.epoch}"
               if row["epoch"] != self.epoch else "the leader lease expired")
        self._on_deposed(why)
        raise Deposed(f"write refused: {why}; this control plane no longer leads")

    @asynccontextmanager
    async def _fenced(self) -> AsyncIterator[Database]:
        async with self.db.transaction() as tx:
            await self._check(tx)
            yield tx

    def transaction(self) -> AbstractAsyncContextManager[Database]:
        """A transaction that starts with the fence check (see the class)."""
        return self._fenced()

    async def run_transaction(self, fn: Callable[[Database], Coroutine[Any, Any, T]]) -> T:
        """`Database.run_transaction`, starting with the fence check."""

        async def fenced(tx: Database) -> T:
            await self._check(tx)
            return await fn(tx)

        return await self.db.run_transaction(fenced)

    async def execute(self, sql: str, *args: Any) -> int:
        """`Database.execute`, fenced."""
        async with self._fenced() as tx:
            return await tx.execute(sql, *args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """`Database.executemany`, fenced."""
        async with self._fenced() as tx:
            await tx.executemany(sql, rows)

    async def script(self, sql: str) -> None:
        """`Database.script`, fenced."""
        async with self._fenced() as tx:
            await tx.script(sql)

    async def copy_records(self, table: str, columns: Sequence[str],
                           records: Iterable[Sequence[Any]]) -> int:
        """`Database.copy_records`, fenced."""
        async with self._fenced() as tx:
            return await tx.copy_records(table, columns, records)

    async def insert_values(self, head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> int:
        """`Database.insert_values`, fenced."""
        async with self._fenced() as tx:
            return await tx.insert_values(head, rows, tail)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """`Database.fetch` (not fenced: reading changes nothing)."""
        return await self.db.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """`Database.fetchrow` (not fenced)."""
        return await self.db.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """`Database.fetchval` (not fenced)."""
        return await self.db.fetchval(sql, *args)

    async def close(self) -> None:
        """Nothing: the store belongs to the control plane, not to this view of it."""
