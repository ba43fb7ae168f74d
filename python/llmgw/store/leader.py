"""The leader lease: which of several control planes on one PostgreSQL places replicas.

One row of `leader_lease`. Taking and renewing are the same single statement, an
`INSERT .. ON CONFLICT DO UPDATE .. WHERE` that succeeds only for the holder or
once the lease has expired, so two control planes racing for an expired lease
cannot both win: PostgreSQL locks the row and re-checks the condition for the
second one. Every time comes from the database's `clock_timestamp()`, never from
a control plane's clock, so a skewed machine can neither steal a live lease nor
keep one it no longer holds.

PostgreSQL only: on SQLite one control plane owns the store and needs no lease
(`llmgw.control.leader`).
"""

from __future__ import annotations

import msgspec

from .db import Database

LEASE = "control-plane"
"""The one lease's name (a column, so another lease could share the table later)."""

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"

_TAKE = f"""
INSERT INTO leader_lease AS l (name, holder, admin_url, agent_address, since, expires_at)
VALUES ($1, $2, $3, $4, {_NOW}, {_NOW} + $5)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder, admin_url = excluded.admin_url,
    agent_address = excluded.agent_address,
    since = CASE WHEN l.holder = excluded.holder THEN l.since ELSE excluded.since END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < excluded.since
RETURNING holder, admin_url, agent_address, since, expires_at, {_NOW} AS now
"""

_CURRENT = f"""
SELECT holder, admin_url, agent_address, since, expires_at, {_NOW} AS now
FROM leader_lease WHERE name = $1
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
