"""The audit log: one row per change, written in the changing transaction; queried newest first."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from .db import Database
from .errors import Invalid, shown
from .views import AuditEvent

MAX_LIMIT = 1000
"""The most events one query answers with."""
_SECRET_FIELDS = frozenset({"key", "hash"})


def _summary(value: Any) -> str | None:
    if value is None:
        return None
    data = msgspec.to_builtins(value)
    if isinstance(data, dict):
        # Views never carry these; dropping them here too means a future view that
        # does still cannot put a key or its hash into the log.
        data = {k: v for k, v in data.items() if k not in _SECRET_FIELDS}
    return msgspec.json.encode(data).decode()


Event = tuple[str, str, str, Any, Any]
"""One event for `record_many`: (actor, action, target, before, after)."""

_INSERT = ("INSERT INTO audit (id, at, actor, action, target, before_json, after_json) "
           "VALUES ($1, $2, $3, $4, $5, $6, $7)")


def _row(at: float, actor: str, action: str, target: str, before: Any, after: Any) -> tuple[Any, ...]:
    # Hex microseconds first: ids sort by time, so ties on `at` still list in order.
    event_id = f"evt_{int(at * 1_000_000):014x}{secrets.token_hex(4)}"
    return (event_id, at, actor, action, target, _summary(before), _summary(after))


async def record(tx: Database, actor: str, action: str, target: str,
                 before: Any = None, after: Any = None, at: float | None = None) -> str:
    """Writes one event through `tx` (the transaction making the change); returns its id.

    `before`/`after` are views (msgspec Structs) or dicts summarising the thing.
    """
    row = _row(time.time() if at is None else at, actor, action, target, before, after)
    await tx.execute(_INSERT, *row)
    return str(row[0])


async def record_many(tx: Database, events: Sequence[Event], at: float | None = None) -> None:
    """Writes `events`, all at `at`, through `tx` in one statement: the rows `record` would
    write one by one, for a change that touches many things at once (revoking keys)."""
    at = time.time() if at is None else at
    if events:
        await tx.executemany(_INSERT, [_row(at, *e) for e in events])


def _like(text: str) -> str:
    # The filter is data: %, _ and \ match themselves, not any character.
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def query(db: Database, *, since: float | None = None, limit: int = 100,
                actor: str | None = None, contains: str | None = None,
                now: float | None = None) -> list[AuditEvent]:
    """Events newest first: within `since` seconds of now, by `actor`, whose action or target
    contains `contains` (case-insensitive, literally); at most `limit` (capped at MAX_LIMIT)."""
    now = time.time() if now is None else now
    for name, text in (("actor", actor), ("contains", contains)):
        # PostgreSQL refuses NUL in text, and no actor or action holds a control character.
        if text is not None and (len(text) > 200 or any(ord(c) < 32 for c in text)):
            raise Invalid("audit.bad_filter", f"{name}={shown(text)} is not something the log "
                          "holds: give at most 200 printable characters", name)
    where = ["at >= $1"]
    args: list[Any] = [now - since if since is not None else 0.0]
    if actor is not None:
        args.append(actor)
        where.append(f"actor = ${len(args)}")
    if contains is not None:
        args.append(_like(contains))
        n = len(args)
        where.append(f"(lower(action) LIKE ${n} ESCAPE '\\' OR lower(target) LIKE ${n} ESCAPE '\\')")
    args.append(max(1, min(limit, MAX_LIMIT)))
    # Only fixed fragments and $n placeholders are joined here; every value is a parameter.
    sql = (f"SELECT id, at, actor, action, target, before_json, after_json FROM audit "
           f"WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ${len(args)}")
    rows = await db.fetch(sql, *args)
    return [AuditEvent(id=r["id"], at=r["at"], actor=r["actor"], action=r["action"],
                       target=r["target"],
                       before=msgspec.json.decode(r["before_json"]) if r["before_json"] else None,
                       after=msgspec.json.decode(r["after_json"]) if r["after_json"] else None)
            for r in rows]
