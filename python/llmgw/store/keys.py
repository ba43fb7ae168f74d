"""API keys: issue (shown once, stored as a keyed hash), list, get, change, revoke, lifetimes.

A key's lifetime is the smallest of the ttl asked for and the maximum key
lifetimes of the gateway (server setting), its org, team and project; asking
for more than a maximum is refused, naming the level, rather than silently cut.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from llmgw.config.units import format_duration
from llmgw.protocol.wire import Limits
from llmgw.secrets.keys import key_hash, key_prefix, new_api_key

from . import audit
from .db import Database, Row, update_row
from .errors import Forbidden, Invalid, NotFound, shown
from .names import check_name, is_id, new_id
from .snapshot import bump
from .tenancy import get_project
from .users import covers, get_user
from .views import IssuedKey, KeyView, limits_json, limits_of

_KEYS = ("SELECT k.id, k.name, k.prefix, k.project_id, k.user_id, k.created_at, k.expires_at, "
         "k.revoked_at, k.last_used_at, k.limits, o.name AS org_name, t.name AS team_name, "
         "p.name AS project_name, u.name AS user_name FROM api_keys k JOIN projects p ON p.id = k.project_id "
         "JOIN teams t ON t.id = p.team_id JOIN orgs o ON o.id = t.org_id LEFT JOIN users u ON u.id = k.user_id")


def _view(r: Row) -> KeyView:
    return KeyView(id=r["id"], name=r["name"], prefix=r["prefix"], project_id=r["project_id"],
                   path=f"{r['org_name']}/{r['team_name']}/{r['project_name']}",
                   user_id=r["user_id"], user=r["user_name"], created_at=r["created_at"], expires_at=r["expires_at"],
                   revoked_at=r["revoked_at"], last_used_at=r["last_used_at"],
                   limits=limits_of(r["limits"]))


def lifetime(ttl: float | None, maxima: Sequence[tuple[str, float | None]]) -> float | None:
    """The lifetime in seconds of a new key (None: it never expires).

    `maxima` are (level, max_key_ttl) from the widest level to the narrowest; a
    `ttl` above any of them is refused with `keys.ttl_too_long` naming the tightest.
    """
    if ttl is not None and not ttl > 0:
        raise Invalid("keys.bad_ttl", "ttl must be a positive duration like 30d", "ttl")
    limits = [(level, m) for level, m in maxima if m is not None]
    if not limits:
        return ttl
    level, tightest = min(limits, key=lambda lm: lm[1])
    if ttl is None:
        return tightest
    if ttl > tightest:
        raise Invalid("keys.ttl_too_long",
                      f"a ttl of {format_duration(ttl)} is longer than the {level} allows "
                      f"({format_duration(tightest)}); ask for {format_duration(tightest)} or less, "
                      "or leave ttl out to get the longest allowed", "ttl")
    return ttl


async def get_key(db: Database, key_id: str, param: str = "id") -> KeyView:
    """The key with this ID; NotFound otherwise (also for text that is not a key ID)."""
    row = await db.fetchrow(_KEYS + " WHERE k.id = $1", key_id) if is_id(key_id, "key") else None
    if row is None:
        raise _not_found(key_id, param)
    return _view(row)


def _not_found(key_id: str, param: str = "id") -> NotFound:
    return NotFound("keys.not_found", f"there is no key {shown(key_id)}; list them with "
                    "`llmgw ctl keys list`", param)


async def list_keys(db: Database, *, project: str | None = None, user: str | None = None,
                    revoked: bool = False) -> list[KeyView]:
    """Keys, newest first: of one project and/or user; revoked ones only when `revoked`."""
    where, args = [], []
    if project is not None:
        args.append((await get_project(db, project)).id)
        where.append(f"k.project_id = ${len(args)}")
    if user is not None:
        args.append((await get_user(db, user)).id)
        where.append(f"k.user_id = ${len(args)}")
    if not revoked:
        where.append("k.revoked_at IS NULL")
    sql = _KEYS + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY k.created_at DESC"
    return [_view(r) for r in await db.fetch(sql, *args)]


async def issue_key(db: Database, actor: str, *, project: str, name: str, hash_key: bytes,
                    user: str | None = None, ttl: float | None = None,
                    limits: Limits | None = None, max_key_ttl: float | None = None,
                    now: float | None = None) -> IssuedKey:
    """Issues a key in a project (for a user who is a member covering it, when given).

    `max_key_ttl` is the gateway-wide maximum (the server setting). The answer is
    the only place the key ever appears; the store keeps its keyed hash.
    """
    check_name(name, "key")
    now = time.time() if now is None else now
    key = new_api_key()
    key_id = new_id("key")
    async with db.transaction() as tx:
        proj = await get_project(tx, project)
        user_id = None
        if user is not None:
            u = await get_user(tx, user)
            if not await covers(tx, u.id, proj):
                raise Forbidden("keys.user_not_member",
                                f"user {u.name!r} is not a member of project {proj.path!r} or of "
                                "the team or org above it; add them first (llmgw ctl members add)",
                                "user")
            user_id = u.id
        # Only the two maxima: the names are in the project's path (names hold no '/').
        above = await tx.fetchrow("SELECT t.max_key_ttl AS team, o.max_key_ttl AS org FROM teams t "
                                  "JOIN orgs o ON o.id = t.org_id WHERE t.id = $1", proj.team_id)
        if above is None:  # the project's row joined them a moment ago, in this transaction
            raise NotFound("tenancy.not_found", f"project {proj.path!r} was deleted while the "
                           "key was issued; issue it again", "project")
        team_path = proj.path.rsplit("/", 1)[0]
        life = lifetime(ttl, [("gateway's max_key_ttl", max_key_ttl),
                              (f"organization {team_path.split('/')[0]!r}", above["org"]),
                              (f"team {team_path!r}", above["team"]),
                              (f"project {proj.path!r}", proj.max_key_ttl)])
        await tx.execute(
            "INSERT INTO api_keys (id, name, prefix, hash, project_id, user_id, limits, created_at, "
            "expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            key_id, name, key_prefix(key), key_hash(hash_key, key), proj.id, user_id,
            limits_json(limits), now, None if life is None else now + life)
        view = await get_key(tx, key_id)
        await bump(tx)
        await audit.record(tx, actor, "key.create", key_id, None, view)
    fields = {f: getattr(view, f) for f in view.__struct_fields__}
    return IssuedKey(key=key.reveal(), **fields)


async def update_key(db: Database, actor: str, key_id: str, *, name: str | UnsetType = UNSET,
                     limits: Limits | UnsetType | None = UNSET) -> KeyView:
    """Renames a key or replaces its limits (None: no limits of its own)."""
    async with db.transaction() as tx:
        before = await get_key(tx, key_id)
        sets: dict[str, Any] = {}
        if not isinstance(name, UnsetType):
            sets["name"] = check_name(name, "key")
        if not isinstance(limits, UnsetType):
            sets["limits"] = limits_json(limits)
        await update_row(tx, "api_keys", before.id, sets)
        after = await get_key(tx, before.id)
        if after != before:
            if after.limits != before.limits:
                await bump(tx)
            await audit.record(tx, actor, "key.update", before.id, before, after)
    return after


async def revoke_key(db: Database, actor: str, key_id: str, now: float | None = None) -> KeyView:
    """Revokes a key (gateways drop it at the next snapshot); revoking again changes nothing."""
    async with db.transaction() as tx:
        key = await get_key(tx, key_id)
        if key.revoked_at is not None:
            return key
        await revoke_ids(tx, actor, [key.id], "revoked", now)
        return await get_key(tx, key.id)


_CHUNK = 500
"""Key ids per statement: well inside the bound parameters SQLite and asyncpg accept."""


async def revoke_ids(tx: Database, actor: str, key_ids: Sequence[str], reason: str,
                     now: float | None = None) -> int:
    """Revokes the unrevoked keys among `key_ids` inside `tx`: one audit row each (with the
    reason) and one snapshot bump when any was; returns how many were. NotFound for an id
    that is no key (the transaction then changes nothing).

    Set-based: one read, one update and one audit insert per 500 keys, however many
    there are (removing a user revokes all their keys at once).
    """
    now = time.time() if now is None else now
    ids = list(dict.fromkeys(key_ids))
    done: list[KeyView] = []
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i:i + _CHUNK]
        rows = await tx.fetch(_KEYS + f" WHERE k.id IN ({_marks(chunk)})", *chunk)
        before = {r["id"]: _view(r) for r in rows}
        if missing := [k for k in chunk if k not in before]:
            raise _not_found(missing[0])
        todo = [before[k] for k in chunk if before[k].revoked_at is None]  # in the order asked
        if not todo:
            continue
        await tx.execute(f"UPDATE api_keys SET revoked_at = $1 WHERE id IN ({_marks(todo, 2)})",
                         now, *(v.id for v in todo))
        # The view after is the one before with revoked_at set: nothing else in it changed.
        await audit.record_many(tx, [
            (actor, "key.revoke", v.id, v,
             {**_builtins(msgspec.structs.replace(v, revoked_at=now)), "reason": reason})
            for v in todo], now)
        done += todo
    if done:
        await bump(tx)
    return len(done)


def _marks(values: Sequence[object], first: int = 1) -> str:
    """`$first, $first+1, ...`, one placeholder per value, for an `IN (...)` list."""
    return ", ".join(f"${n}" for n in range(first, first + len(values)))


def _builtins(view: KeyView) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(view)
    return out
