"""Users and their memberships: who may hold keys where.

A membership at an org or team covers every project below it. Changes that take
keys away (deleting a user, removing a membership) are in `removals`, next to
the key revocation they need.
"""

from __future__ import annotations

import re
import time
from typing import Any

from msgspec import UNSET, UnsetType

from . import audit
from .db import Conflict, Database, Row, update_row
from .errors import Invalid, NotFound, Taken, shown
from .names import check_name, is_id, new_id, parse_scope
from .tenancy import get_org, get_project, get_team
from .views import MemberView, ProjectView, Role, UserView

ROLES: tuple[Role, ...] = ("owner", "admin", "member", "viewer")
_EMAIL = re.compile(r"^[^@\s\x00-\x1f\x7f]{1,64}@[^@\s\x00-\x1f\x7f]{1,190}$")
_MEMBERS = ("SELECT m.user_id, u.name AS user_name, m.scope_id, m.scope_kind, m.role, "
            "o.name AS org_name, t.name AS team_name, p.name AS project_name, "
            "tp.name AS pteam_name, op.name AS porg_name, ot.name AS torg_name "
            "FROM memberships m JOIN users u ON u.id = m.user_id "
            "LEFT JOIN orgs o ON o.id = m.scope_id "
            "LEFT JOIN teams t ON t.id = m.scope_id LEFT JOIN orgs ot ON ot.id = t.org_id "
            "LEFT JOIN projects p ON p.id = m.scope_id LEFT JOIN teams tp ON tp.id = p.team_id "
            "LEFT JOIN orgs op ON op.id = tp.org_id")


def _user_view(r: Row) -> UserView:
    return UserView(id=r["id"], name=r["name"], email=r["email"], created_at=r["created_at"])


def _member_view(r: Row) -> MemberView:
    kind = r["scope_kind"]
    if kind == "org":
        path = r["org_name"]
    elif kind == "team":
        path = f"{r['torg_name']}/{r['team_name']}"
    else:
        path = f"{r['porg_name']}/{r['pteam_name']}/{r['project_name']}"
    return MemberView(user_id=r["user_id"], user=r["user_name"], scope=f"{kind}:{path}",
                      scope_id=r["scope_id"], role=r["role"])


def _email(email: str | None) -> str | None:
    if email is not None and not _EMAIL.match(email):
        raise Invalid("users.bad_email", f"{shown(email)} is not an email address; write it like "
                      "alice@example.com, or leave it out", "email")
    return email


async def get_user(db: Database, ref: str, param: str = "user") -> UserView:
    """The user with this ID or name; NotFound otherwise."""
    if is_id(ref, "user"):
        row = await db.fetchrow("SELECT * FROM users WHERE id = $1", ref)
    else:
        row = await db.fetchrow("SELECT * FROM users WHERE name = $1", check_name(ref, "user", param))
    if row is None:
        raise NotFound("users.not_found", f"there is no user {shown(ref)}; list them with "
                       "`llmgw ctl users list`", param)
    return _user_view(row)


async def list_users(db: Database) -> list[UserView]:
    """Every user, by name."""
    return [_user_view(r) for r in await db.fetch("SELECT * FROM users ORDER BY name")]


async def create_user(db: Database, actor: str, name: str, email: str | None = None) -> UserView:
    """Adds a user; Taken when the name is."""
    check_name(name, "user")
    user_id = new_id("user")
    async with db.transaction() as tx:
        try:
            await tx.execute("INSERT INTO users (id, name, email, created_at) VALUES ($1, $2, $3, $4)",
                             user_id, name, _email(email), time.time())
        except Conflict as e:
            raise Taken("tenancy.name_taken", f"a user named {shown(name)} already exists; pick "
                        "another name", "name") from e
        view = await get_user(tx, user_id)
        await audit.record(tx, actor, "user.create", f"user:{name}", None, view)
    return view


async def update_user(db: Database, actor: str, ref: str, *, name: str | UnsetType = UNSET,
                      email: str | UnsetType | None = UNSET) -> UserView:
    """Renames a user or changes their email."""
    async with db.transaction() as tx:
        before = await get_user(tx, ref)
        sets: dict[str, Any] = {}
        if not isinstance(name, UnsetType):
            sets["name"] = check_name(name, "user")
        if not isinstance(email, UnsetType):
            sets["email"] = _email(email)
        if sets:
            try:
                await update_row(tx, "users", before.id, sets)
            except Conflict as e:
                raise Taken("tenancy.name_taken", f"a user named {shown(str(name))} already "
                            "exists; pick another name", "name") from e
        after = await get_user(tx, before.id)
        if after != before:
            await audit.record(tx, actor, "user.update", f"user:{after.name}", before, after)
    return after


async def resolve_scope(db: Database, text: str, param: str = "scope") -> tuple[str, str, str]:
    """(kind, id, `kind:path`) of a scope reference (`team:acme/ml`, `org:org_...`, a bare ID)."""
    kind, ref = parse_scope(text, param)
    if kind == "org":
        org = await get_org(db, ref, param)
        return kind, org.id, f"org:{org.name}"
    if kind == "team":
        team = await get_team(db, ref, param)
        return kind, team.id, f"team:{team.path}"
    project = await get_project(db, ref, param)
    return kind, project.id, f"project:{project.path}"


async def covers(db: Database, user_id: str, project: ProjectView) -> bool:
    """Whether one of the user's memberships covers the project (at it, its team or its org)."""
    row = await db.fetchrow("SELECT 1 FROM memberships WHERE user_id = $1 AND scope_id IN ($2, $3, $4)",
                            user_id, project.id, project.team_id, project.org_id)
    return row is not None


async def list_members(db: Database, scope: str | None = None) -> list[MemberView]:
    """Memberships (at one scope when given, not those above or below it), by user name."""
    if scope is None:
        rows = await db.fetch(_MEMBERS + " ORDER BY u.name, m.scope_id")
    else:
        _, scope_id, _ = await resolve_scope(db, scope)
        rows = await db.fetch(_MEMBERS + " WHERE m.scope_id = $1 ORDER BY u.name", scope_id)
    return [_member_view(r) for r in rows]


def check_role(role: str) -> Role:
    """`role` when it is one of ROLES; Invalid otherwise."""
    for r in ROLES:
        if r == role:
            return r
    raise Invalid("members.bad_role", f"{shown(role)} is not a role; use one of "
                  f"{', '.join(ROLES)}", "role")


async def get_member(db: Database, user_id: str, scope_id: str) -> MemberView | None:
    """One membership, or None."""
    row = await db.fetchrow(_MEMBERS + " WHERE m.user_id = $1 AND m.scope_id = $2", user_id, scope_id)
    return None if row is None else _member_view(row)


async def add_member(db: Database, actor: str, user: str, scope: str, role: str) -> MemberView:
    """Gives a user a role at a scope; when they have one there already, changes it."""
    checked = check_role(role)
    async with db.transaction() as tx:
        u = await get_user(tx, user)
        kind, scope_id, label = await resolve_scope(tx, scope)
        before = await get_member(tx, u.id, scope_id)
        await tx.execute(
            "INSERT INTO memberships (user_id, scope_id, scope_kind, role, created_at) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id, scope_id) DO UPDATE SET role = $4",
            u.id, scope_id, kind, checked, time.time())
        after = await get_member(tx, u.id, scope_id)
        assert after is not None
        if after != before:
            action = "member.add" if before is None else "member.update"
            await audit.record(tx, actor, action, f"user:{u.name}@{label}", before, after)
    return after
