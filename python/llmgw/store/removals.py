"""Changes that take keys away: deleting a user, removing a membership.

A user removed from a project, or from the team or org above it, loses the keys
they had in the projects no other membership of theirs still covers: the keys
are revoked in the same transaction, each audited, and the snapshot bumped, so
gateways stop taking them within a snapshot round trip.
"""

from __future__ import annotations

from . import audit
from .db import Database
from .errors import NotFound
from .keys import revoke_ids
from .users import get_member, get_user, resolve_scope
from .views import MemberView, UserView


async def remove_member(db: Database, actor: str, user: str, scope: str) -> MemberView:
    """Removes a user's membership at a scope and revokes the keys it alone allowed."""
    async with db.transaction() as tx:
        u = await get_user(tx, user)
        _, scope_id, label = await resolve_scope(tx, scope)
        member = await get_member(tx, u.id, scope_id)
        if member is None:
            raise NotFound("members.not_found", f"user {u.name!r} is not a member at {label}; "
                           f"list that scope's members with `llmgw ctl members list --in "
                           f"{label.partition(':')[2]}`",
                           "scope")
        await tx.execute("DELETE FROM memberships WHERE user_id = $1 AND scope_id = $2",
                         u.id, scope_id)
        await audit.record(tx, actor, "member.remove", f"user:{u.name}@{label}", member, None)
        remaining = {r[0] for r in await tx.fetch(
            "SELECT scope_id FROM memberships WHERE user_id = $1", u.id)}
        rows = await tx.fetch(
            "SELECT k.id, p.id AS project_id, p.team_id, t.org_id FROM api_keys k "
            "JOIN projects p ON p.id = k.project_id JOIN teams t ON t.id = p.team_id "
            "WHERE k.user_id = $1 AND k.revoked_at IS NULL "
            "AND (p.id = $2 OR p.team_id = $2 OR t.org_id = $2) ORDER BY k.id", u.id, scope_id)
        lost = [r["id"] for r in rows
                if not remaining & {r["project_id"], r["team_id"], r["org_id"]}]
        await revoke_ids(tx, actor, lost, f"user {u.name} removed from {label}")
    return member


async def delete_user(db: Database, actor: str, user: str) -> UserView:
    """Deletes a user: revokes all their keys and removes their memberships."""
    async with db.transaction() as tx:
        u = await get_user(tx, user)
        keys = [r[0] for r in await tx.fetch(
            "SELECT id FROM api_keys WHERE user_id = $1 AND revoked_at IS NULL ORDER BY id", u.id)]
        await revoke_ids(tx, actor, keys, f"user {u.name} deleted")
        members = [r[0] for r in await tx.fetch(
            "SELECT scope_id FROM memberships WHERE user_id = $1 ORDER BY scope_id", u.id)]
        await tx.execute("DELETE FROM memberships WHERE user_id = $1", u.id)
        await tx.execute("DELETE FROM users WHERE id = $1", u.id)
        await audit.record(tx, actor, "user.delete", f"user:{u.name}",
                           {**_plain(u), "memberships": members}, None)
    return u


def _plain(u: UserView) -> dict[str, object]:
    return {f: getattr(u, f) for f in u.__struct_fields__}
