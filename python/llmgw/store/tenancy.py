"""The tenancy tree: organizations, teams and projects; create, list, get, rename, move,
and delete when empty. Every change writes its audit row, and bumps the snapshot
version when gateways hold what it changed, in its own transaction.

References are IDs or paths (`acme`, `acme/ml`, `acme/ml/chat`); see `names`.
"""

from __future__ import annotations

import time
from typing import Any

from msgspec import UNSET, UnsetType

from llmgw.protocol.wire import Limits

from . import audit
from .db import Conflict, Database, Row, update_row
from .errors import Invalid, NotFound, Taken, shown
from .names import check_name, is_id, new_id, split_path
from .snapshot import bump
from .views import OrgView, ProjectView, TeamView, limits_json, limits_of

_ORGS = ("SELECT o.id, o.name, o.max_key_ttl, o.limits, o.created_at, "
         "(SELECT COUNT(*) FROM teams t WHERE t.org_id = o.id) AS teams FROM orgs o")
_TEAMS = ("SELECT t.id, t.name, t.org_id, o.name AS org_name, t.max_key_ttl, t.limits, t.created_at, "
          "(SELECT COUNT(*) FROM projects p WHERE p.team_id = t.id) AS projects "
          "FROM teams t JOIN orgs o ON o.id = t.org_id")
_PROJECTS = ("SELECT p.id, p.name, p.team_id, t.name AS team_name, t.org_id, o.name AS org_name, "
             "p.max_key_ttl, p.limits, p.keep_bodies, p.created_at, "
             "(SELECT COUNT(*) FROM api_keys k WHERE k.project_id = p.id AND k.revoked_at IS NULL) "
             "AS keys FROM projects p JOIN teams t ON t.id = p.team_id JOIN orgs o ON o.id = t.org_id")


def org_view(r: Row) -> OrgView:
    """An OrgView from a row of the org query."""
    return OrgView(id=r["id"], name=r["name"], max_key_ttl=r["max_key_ttl"],
                   limits=limits_of(r["limits"]), created_at=r["created_at"], teams=int(r["teams"]))


def team_view(r: Row) -> TeamView:
    """A TeamView from a row of the team query."""
    return TeamView(id=r["id"], name=r["name"], org_id=r["org_id"],
                    path=f"{r['org_name']}/{r['name']}", max_key_ttl=r["max_key_ttl"],
                    limits=limits_of(r["limits"]), created_at=r["created_at"],
                    projects=int(r["projects"]))


def project_view(r: Row) -> ProjectView:
    """A ProjectView from a row of the project query."""
    return ProjectView(id=r["id"], name=r["name"], team_id=r["team_id"], org_id=r["org_id"],
                       path=f"{r['org_name']}/{r['team_name']}/{r['name']}",
                       limits=limits_of(r["limits"]), keep_bodies=bool(r["keep_bodies"]),
                       max_key_ttl=r["max_key_ttl"], created_at=r["created_at"], keys=int(r["keys"]))


def _not_found(what: str, ref: str, param: str, listing: str) -> NotFound:
    """`listing`: the whole command that lists them, as the user types it."""
    return NotFound("tenancy.not_found", f"there is no {what} {shown(ref)}; list them with `{listing}`", param)


def _ttl(value: float | None, param: str = "max_key_ttl") -> float | None:
    if value is not None and not value > 0:
        raise Invalid("tenancy.bad_ttl", f"max_key_ttl must be a positive duration like 90d, "
                      f"not {value!r}", param)
    return value


# --- resolving references ------------------------------------------------------------------

async def get_org(db: Database, ref: str, param: str = "org") -> OrgView:
    """The org with this ID or name; NotFound otherwise."""
    if is_id(ref, "org"):
        row = await db.fetchrow(_ORGS + " WHERE o.id = $1", ref)
    else:
        row = await db.fetchrow(_ORGS + " WHERE o.name = $1", check_name(ref, "organization", param))
    if row is None:
        raise _not_found("organization", ref, param, "llmgw ctl orgs list")
    return org_view(row)


async def get_team(db: Database, ref: str, param: str = "team") -> TeamView:
    """The team with this ID or ORG/TEAM path; NotFound otherwise."""
    if is_id(ref, "team"):
        row = await db.fetchrow(_TEAMS + " WHERE t.id = $1", ref)
    else:
        org, team = split_path(ref, 2, "team", param)
        row = await db.fetchrow(_TEAMS + " WHERE o.name = $1 AND t.name = $2", org, team)
    if row is None:
        raise _not_found("team", ref, param, "llmgw ctl teams list")
    return team_view(row)


async def get_project(db: Database, ref: str, param: str = "project") -> ProjectView:
    """The project with this ID or ORG/TEAM/PROJECT path; NotFound otherwise."""
    if is_id(ref, "project"):
        row = await db.fetchrow(_PROJECTS + " WHERE p.id = $1", ref)
    else:
        org, team, project = split_path(ref, 3, "project", param)
        row = await db.fetchrow(_PROJECTS + " WHERE o.name = $1 AND t.name = $2 AND p.name = $3",
                                org, team, project)
    if row is None:
        raise _not_found("project", ref, param, "llmgw ctl projects list")
    return project_view(row)


# --- organizations -------------------------------------------------------------------------

async def list_orgs(db: Database) -> list[OrgView]:
    """Every organization, by name."""
    return [org_view(r) for r in await db.fetch(_ORGS + " ORDER BY o.name")]


async def create_org(db: Database, actor: str, name: str, *, max_key_ttl: float | None = None,
                     limits: Limits | None = None) -> OrgView:
    """Adds an organization; Taken when the name is."""
    check_name(name, "organization")
    org_id = new_id("org")
    async with db.transaction() as tx:
        try:
            await tx.execute("INSERT INTO orgs (id, name, max_key_ttl, limits, created_at) "
                             "VALUES ($1, $2, $3, $4, $5)",
                             org_id, name, _ttl(max_key_ttl), limits_json(limits), time.time())
        except Conflict as e:
            raise _taken("an organization", name, "pick another name") from e
        view = await get_org(tx, org_id)
        await audit.record(tx, actor, "org.create", f"org:{name}", None, view)
    return view


def _taken(what: str, name: str, where: str) -> Taken:
    return Taken("tenancy.name_taken", f"{what} named {shown(name)} already exists; {where}", "name")


def _sibling(parent_kind: str, parent: str, kind: str, name: str) -> Taken:
    return Taken("tenancy.name_taken", f"{parent_kind} {parent!r} already has a {kind} named "
                 f"{name!r}; rename one of the two first", "name")


async def update_org(db: Database, actor: str, ref: str, *, name: str | UnsetType = UNSET,
                     max_key_ttl: float | UnsetType | None = UNSET,
                     limits: Limits | UnsetType | None = UNSET) -> OrgView:
    """Renames an organization or changes its maximum key lifetime or limits."""
    async with db.transaction() as tx:
        before = await get_org(tx, ref)
        sets: dict[str, Any] = {}
        if not isinstance(name, UnsetType):
            sets["name"] = check_name(name, "organization")
        if not isinstance(max_key_ttl, UnsetType):
            sets["max_key_ttl"] = _ttl(max_key_ttl)
        if not isinstance(limits, UnsetType):
            sets["limits"] = limits_json(limits)
        try:
            await update_row(tx, "orgs", before.id, sets)
        except Conflict as e:
            raise _taken("an organization", str(name), "pick another name") from e
        after = await get_org(tx, before.id)
        if after != before:
            await audit.record(tx, actor, "org.update", f"org:{after.name}", before, after)
    return after


async def delete_org(db: Database, actor: str, ref: str) -> OrgView:
    """Deletes an organization that has no teams (and its memberships); Taken otherwise."""
    async with db.transaction() as tx:
        org = await get_org(tx, ref)
        names = [r[0] for r in await tx.fetch(
            "SELECT name FROM teams WHERE org_id = $1 ORDER BY name LIMIT 5", org.id)]
        if names:
            raise Taken("tenancy.not_empty",
                        f"organization {org.name!r} still has {org.teams} team(s) "
                        f"({', '.join(names)}{', ...' if org.teams > len(names) else ''}); "
                        "delete or move them first", "org")
        await tx.execute("DELETE FROM memberships WHERE scope_id = $1", org.id)
        await tx.execute("DELETE FROM orgs WHERE id = $1", org.id)
        await audit.record(tx, actor, "org.delete", f"org:{org.name}", org, None)
    return org


# --- teams ---------------------------------------------------------------------------------

async def list_teams(db: Database, org: str | None = None) -> list[TeamView]:
    """Every team (of one organization when `org` is given), by path."""
    if org is None:
        rows = await db.fetch(_TEAMS + " ORDER BY o.name, t.name")
    else:
        org_id = (await get_org(db, org)).id
        rows = await db.fetch(_TEAMS + " WHERE t.org_id = $1 ORDER BY t.name", org_id)
    return [team_view(r) for r in rows]


async def create_team(db: Database, actor: str, org: str, name: str, *,
                      max_key_ttl: float | None = None, limits: Limits | None = None) -> TeamView:
    """Adds a team to an organization; Taken when the org has a team of that name."""
    check_name(name, "team")
    team_id = new_id("team")
    async with db.transaction() as tx:
        parent = await get_org(tx, org)
        try:
            await tx.execute("INSERT INTO teams (id, org_id, name, max_key_ttl, limits, created_at) "
                             "VALUES ($1, $2, $3, $4, $5, $6)", team_id, parent.id, name,
                             _ttl(max_key_ttl), limits_json(limits), time.time())
        except Conflict as e:
            raise _taken("a team", name, f"organization {parent.name!r} has it; pick another "
                         "name") from e
        view = await get_team(tx, team_id)
        await audit.record(tx, actor, "team.create", f"team:{view.path}", None, view)
    return view


async def update_team(db: Database, actor: str, ref: str, *, name: str | UnsetType = UNSET,
                      org: str | UnsetType = UNSET, max_key_ttl: float | UnsetType | None = UNSET,
                      limits: Limits | UnsetType | None = UNSET) -> TeamView:
    """Renames a team, moves it to another organization (`org`), or changes its settings."""
    async with db.transaction() as tx:
        before = await get_team(tx, ref)
        sets: dict[str, Any] = {}
        parent = before.path.split("/")[0]
        if not isinstance(name, UnsetType):
            sets["name"] = check_name(name, "team")
        if not isinstance(org, UnsetType):
            target = await get_org(tx, org, "org")
            sets["org_id"], parent = target.id, target.name
        if not isinstance(max_key_ttl, UnsetType):
            sets["max_key_ttl"] = _ttl(max_key_ttl)
        if not isinstance(limits, UnsetType):
            sets["limits"] = limits_json(limits)
        try:
            await update_row(tx, "teams", before.id, sets)
        except Conflict as e:
            raise _sibling("organization", parent, "team", sets.get("name", before.name)) from e
        after = await get_team(tx, before.id)
        if after != before:
            if after.org_id != before.org_id:
                await bump(tx)  # keys' org_id changed in what gateways hold
            await audit.record(tx, actor, "team.update", f"team:{after.path}", before, after)
    return after


async def delete_team(db: Database, actor: str, ref: str) -> TeamView:
    """Deletes a team that has no projects (and its memberships); Taken otherwise."""
    async with db.transaction() as tx:
        team = await get_team(tx, ref)
        names = [r[0] for r in await tx.fetch(
            "SELECT name FROM projects WHERE team_id = $1 ORDER BY name LIMIT 5", team.id)]
        if names:
            raise Taken("tenancy.not_empty",
                        f"team {team.path!r} still has {team.projects} project(s) "
                        f"({', '.join(names)}{', ...' if team.projects > len(names) else ''}); "
                        "delete or move them first", "team")
        await tx.execute("DELETE FROM memberships WHERE scope_id = $1", team.id)
        await tx.execute("DELETE FROM teams WHERE id = $1", team.id)
        await audit.record(tx, actor, "team.delete", f"team:{team.path}", team, None)
    return team


# --- projects ------------------------------------------------------------------------------

async def list_projects(db: Database, team: str | None = None) -> list[ProjectView]:
    """Every project (of one team when `team` is given), by path."""
    if team is None:
        rows = await db.fetch(_PROJECTS + " ORDER BY o.name, t.name, p.name")
    else:
        team_id = (await get_team(db, team)).id
        rows = await db.fetch(_PROJECTS + " WHERE p.team_id = $1 ORDER BY p.name", team_id)
    return [project_view(r) for r in rows]


async def create_project(db: Database, actor: str, team: str, name: str, *,
                         limits: Limits | None = None, keep_bodies: bool = False,
                         max_key_ttl: float | None = None) -> ProjectView:
    """Adds a project to a team; Taken when the team has a project of that name."""
    check_name(name, "project")
    project_id = new_id("project")
    async with db.transaction() as tx:
        parent = await get_team(tx, team)
        try:
            await tx.execute(
                "INSERT INTO projects (id, team_id, name, max_key_ttl, limits, keep_bodies, "
                "created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)", project_id, parent.id, name,
                _ttl(max_key_ttl), limits_json(limits), int(keep_bodies), time.time())
        except Conflict as e:
            raise _taken("a project", name, f"team {parent.path!r} has it; pick another name") from e
        view = await get_project(tx, project_id)
        await bump(tx)  # gateways hold every project's limits
        await audit.record(tx, actor, "project.create", f"project:{view.path}", None, view)
    return view


async def update_project(db: Database, actor: str, ref: str, *, name: str | UnsetType = UNSET,
                         team: str | UnsetType = UNSET, limits: Limits | UnsetType | None = UNSET,
                         keep_bodies: bool | UnsetType = UNSET,
                         max_key_ttl: float | UnsetType | None = UNSET) -> ProjectView:
    """Renames a project, moves it to another team (`team`), or changes its settings."""
    async with db.transaction() as tx:
        before = await get_project(tx, ref)
        sets: dict[str, Any] = {}
        parent = before.path.rsplit("/", 1)[0]
        if not isinstance(name, UnsetType):
            sets["name"] = check_name(name, "project")
        if not isinstance(team, UnsetType):
            target = await get_team(tx, team, "team")
            sets["team_id"], parent = target.id, target.path
        if not isinstance(limits, UnsetType):
            sets["limits"] = limits_json(limits)
        if not isinstance(keep_bodies, UnsetType):
            sets["keep_bodies"] = int(keep_bodies)
        if not isinstance(max_key_ttl, UnsetType):
            sets["max_key_ttl"] = _ttl(max_key_ttl)
        try:
            await update_row(tx, "projects", before.id, sets)
        except Conflict as e:
            raise _sibling("team", parent, "project", sets.get("name", before.name)) from e
        after = await get_project(tx, before.id)
        if after != before:
            held = ("team_id", "org_id", "limits", "keep_bodies")
            if any(getattr(after, f) != getattr(before, f) for f in held):
                await bump(tx)
            await audit.record(tx, actor, "project.update", f"project:{after.path}", before, after)
    return after


async def delete_project(db: Database, actor: str, ref: str) -> ProjectView:
    """Deletes a project none of whose keys is still unrevoked (its revoked keys and its
    memberships go with it); Taken otherwise."""
    async with db.transaction() as tx:
        project = await get_project(tx, ref)
        if project.keys:
            raise Taken("tenancy.not_empty",
                        f"project {project.path!r} still has {project.keys} key(s) not revoked; "
                        f"revoke them first (llmgw ctl keys list --in {project.path})", "project")
        await tx.execute("DELETE FROM api_keys WHERE project_id = $1", project.id)
        await tx.execute("DELETE FROM memberships WHERE scope_id = $1", project.id)
        await tx.execute("DELETE FROM projects WHERE id = $1", project.id)
        await bump(tx)
        await audit.record(tx, actor, "project.delete", f"project:{project.path}", project, None)
    return project


_PATHS = """
SELECT o.id, o.name FROM orgs o
UNION ALL
SELECT t.id, o.name || '/' || t.name FROM teams t JOIN orgs o ON o.id = t.org_id
UNION ALL
SELECT p.id, o.name || '/' || t.name || '/' || p.name
  FROM projects p JOIN teams t ON t.id = p.team_id JOIN orgs o ON o.id = t.org_id
"""


async def scope_paths(db: Database, ids: list[str]) -> dict[str, str]:
    """Org, team and project ids -> their paths (`acme`, `acme/ml`, `acme/ml/chat`); ids that
    no longer exist are left out. Reads the whole (small) tree once rather than building an
    IN list per call: the tree has thousands of rows, usage reports ask for many ids."""
    wanted = set(ids)
    return {r[0]: r[1] for r in await db.fetch(_PATHS) if r[0] in wanted}
