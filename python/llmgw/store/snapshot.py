"""What gateways hold: every usable key and every project's limits, and the version of it.

`state.snapshot_version` is bumped in the same transaction as every change that
alters what gateways hold, so a gateway that has version N and sees N+1 knows
there is something new, and one that reads version N's contents never misses a
change committed after it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from llmgw.protocol.wire import KeyEntry, Snapshot

from .db import Database
from .views import limits_of


async def bump(tx: Database) -> int:
    """Increments the snapshot version inside `tx`; returns the new version."""
    value = await tx.fetchval(
        "UPDATE state SET value = value + 1 WHERE name = 'snapshot_version' RETURNING value")
    return int(value)


async def snapshot_version(db: Database) -> int:
    """The current snapshot version."""
    return int(await db.fetchval("SELECT value FROM state WHERE name = 'snapshot_version'"))


async def build_snapshot(db: Database, now: float | None = None) -> Snapshot:
    """Every usable key (not revoked, not expired) with its tree path, limits and project's
    keep_bodies, and every project's limits, stamped with the version read first."""
    now = time.time() if now is None else now
    # The version is read before the contents (not in one transaction, which on SQLite
    # would take the write lock): contents can only be newer than the version, and a
    # newer change has bumped the version past it, so gateways fetch again.
    version = await snapshot_version(db)
    projects = {r["id"]: limits_of(r["limits"])
                for r in await db.fetch("SELECT id, limits FROM projects")}
    rows = await db.fetch(
        "SELECT k.id, k.hash, k.user_id, k.expires_at, k.limits, k.project_id, "
        "p.team_id, t.org_id, p.keep_bodies "
        "FROM api_keys k JOIN projects p ON p.id = k.project_id JOIN teams t ON t.id = p.team_id "
        "WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > $1) "
        "ORDER BY k.id", now)
    keys = [KeyEntry(key_id=r["id"], hash=r["hash"], org_id=r["org_id"], team_id=r["team_id"],
                     project_id=r["project_id"], user_id=r["user_id"], expires_at=r["expires_at"],
                     limits=limits_of(r["limits"]), keep_bodies=bool(r["keep_bodies"]))
            for r in rows]
    return Snapshot(version=version, keys=keys, projects=projects)


async def touch_keys(db: Database, last_used: Mapping[str, float]) -> None:
    """Records when keys were last used (from gateways' usage batches); never moves one back.

    Does not bump the version: gateways do not hold last use.
    """
    if not last_used:
        return
    await db.executemany(
        "UPDATE api_keys SET last_used_at = $2 WHERE id = $1 "
        "AND (last_used_at IS NULL OR last_used_at < $2)",
        sorted(last_used.items()))
