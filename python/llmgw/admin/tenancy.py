"""Admin routes of the tenancy tree: organizations, teams, projects, users and memberships.

Handlers only translate: the body's Struct into store calls, the store's
refusals into 400/403/404/409 (`store_errors.mapped`). In URL paths a team or
project may be named by its path with ':' for '/' (`acme:ml:chat`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Struct, UnsetType

from llmgw.protocol.wire import Limits
from llmgw.store import removals, tenancy, users
from llmgw.store.views import MemberView, OrgView, ProjectView, Role, TeamView, UserView

from .route import ApiError, Param, Request, Route
from .store_errors import Duration, Email, Name, Ref, mapped, path_ref, seconds

Scope = Annotated[str, msgspec.Meta(
    min_length=1, max_length=200,
    description="org:ORG, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an org, team or project ID.",
    examples=["team:acme/ml"])]


class _Body(Struct, forbid_unknown_fields=True, kw_only=True):
    """Request bodies refuse fields they do not know, so a typo is a 400, not a silent no-op."""


class OrgCreate(_Body):
    """A new organization."""

    name: Name
    max_key_ttl: Duration | None = None
    """The longest lifetime of keys issued in it; none when absent."""
    limits: Limits | None = None


class OrgPatch(_Body):
    """Changes to an organization; fields left out stay as they are, null clears."""

    name: Name | UnsetType = UNSET
    max_key_ttl: Duration | UnsetType | None = UNSET
    limits: Limits | UnsetType | None = UNSET


class TeamCreate(_Body):
    """A new team in an organization."""

    org: Ref
    """The organization's ID or name."""
    name: Name
    max_key_ttl: Duration | None = None
    limits: Limits | None = None


class TeamPatch(_Body):
    """Changes to a team; `org` moves it to another organization."""

    name: Name | UnsetType = UNSET
    org: Ref | UnsetType = UNSET
    max_key_ttl: Duration | UnsetType | None = UNSET
    limits: Limits | UnsetType | None = UNSET


class ProjectCreate(_Body):
    """A new project in a team."""

    team: Ref
    """The team's ID or ORG/TEAM path."""
    name: Name
    limits: Limits | None = None
    keep_bodies: bool = False
    max_key_ttl: Duration | None = None


class ProjectPatch(_Body):
    """Changes to a project; `team` moves it to another team."""

    name: Name | UnsetType = UNSET
    team: Ref | UnsetType = UNSET
    limits: Limits | UnsetType | None = UNSET
    keep_bodies: bool | UnsetType = UNSET
    max_key_ttl: Duration | UnsetType | None = UNSET


class UserCreate(_Body):
    """A new user."""

    name: Name
    email: Email | None = None


class UserPatch(_Body):
    """Changes to a user."""

    name: Name | UnsetType = UNSET
    email: Email | UnsetType | None = UNSET


class MemberAdd(_Body):
    """A role for a user at a scope (it replaces the role they had there, if any)."""

    user: Ref
    """The user's ID or name."""
    scope: Scope
    role: Role


def _ttl(value: str | UnsetType | None) -> float | UnsetType | None:
    return value if isinstance(value, UnsetType) else seconds(value, "tenancy.bad_ttl",
                                                              "max_key_ttl")


# --- organizations -------------------------------------------------------------------------

@mapped
async def list_orgs(req: Request) -> list[OrgView]:
    """GET /api/v1/orgs."""
    return await tenancy.list_orgs(req.db)


@mapped
async def create_org(req: Request) -> OrgView:
    """POST /api/v1/orgs."""
    b: OrgCreate = req.body
    return await tenancy.create_org(req.db, req.actor, b.name, max_key_ttl=seconds(
        b.max_key_ttl, "tenancy.bad_ttl", "max_key_ttl"), limits=b.limits)


@mapped
async def get_org(req: Request) -> OrgView:
    """GET /api/v1/orgs/{org}."""
    return await tenancy.get_org(req.db, req.path_params["org"])


@mapped
async def patch_org(req: Request) -> OrgView:
    """PATCH /api/v1/orgs/{org}."""
    b: OrgPatch = req.body
    return await tenancy.update_org(req.db, req.actor, req.path_params["org"], name=b.name,
                                    max_key_ttl=_ttl(b.max_key_ttl), limits=b.limits)


@mapped
async def delete_org(req: Request) -> OrgView:
    """DELETE /api/v1/orgs/{org}."""
    return await tenancy.delete_org(req.db, req.actor, req.path_params["org"])


# --- teams ---------------------------------------------------------------------------------

@mapped
async def list_teams(req: Request) -> list[TeamView]:
    """GET /api/v1/teams?org=."""
    return await tenancy.list_teams(req.db, req.query.get("org") or None)


@mapped
async def create_team(req: Request) -> TeamView:
    """POST /api/v1/teams."""
    b: TeamCreate = req.body
    return await tenancy.create_team(req.db, req.actor, b.org, b.name, max_key_ttl=seconds(
        b.max_key_ttl, "tenancy.bad_ttl", "max_key_ttl"), limits=b.limits)


@mapped
async def get_team(req: Request) -> TeamView:
    """GET /api/v1/teams/{team}."""
    return await tenancy.get_team(req.db, path_ref(req, "team"))


@mapped
async def patch_team(req: Request) -> TeamView:
    """PATCH /api/v1/teams/{team}."""
    b: TeamPatch = req.body
    return await tenancy.update_team(req.db, req.actor, path_ref(req, "team"), name=b.name,
                                     org=b.org, max_key_ttl=_ttl(b.max_key_ttl), limits=b.limits)


@mapped
async def delete_team(req: Request) -> TeamView:
    """DELETE /api/v1/teams/{team}."""
    return await tenancy.delete_team(req.db, req.actor, path_ref(req, "team"))


# --- projects ------------------------------------------------------------------------------

@mapped
async def list_projects(req: Request) -> list[ProjectView]:
    """GET /api/v1/projects?team=."""
    return await tenancy.list_projects(req.db, req.query.get("team") or None)


@mapped
async def create_project(req: Request) -> ProjectView:
    """POST /api/v1/projects."""
    b: ProjectCreate = req.body
    return await tenancy.create_project(
        req.db, req.actor, b.team, b.name, limits=b.limits, keep_bodies=b.keep_bodies,
        max_key_ttl=seconds(b.max_key_ttl, "tenancy.bad_ttl", "max_key_ttl"))


@mapped
async def get_project(req: Request) -> ProjectView:
    """GET /api/v1/projects/{project}."""
    return await tenancy.get_project(req.db, path_ref(req, "project"))


@mapped
async def patch_project(req: Request) -> ProjectView:
    """PATCH /api/v1/projects/{project}."""
    b: ProjectPatch = req.body
    return await tenancy.update_project(
        req.db, req.actor, path_ref(req, "project"), name=b.name, team=b.team, limits=b.limits,
        keep_bodies=b.keep_bodies, max_key_ttl=_ttl(b.max_key_ttl))


@mapped
async def delete_project(req: Request) -> ProjectView:
    """DELETE /api/v1/projects/{project}."""
    return await tenancy.delete_project(req.db, req.actor, path_ref(req, "project"))


# --- users and members ---------------------------------------------------------------------

@mapped
async def list_users(req: Request) -> list[UserView]:
    """GET /api/v1/users."""
    return await users.list_users(req.db)


@mapped
async def create_user(req: Request) -> UserView:
    """POST /api/v1/users."""
    b: UserCreate = req.body
    return await users.create_user(req.db, req.actor, b.name, b.email)


@mapped
async def get_user(req: Request) -> UserView:
    """GET /api/v1/users/{user}."""
    return await users.get_user(req.db, req.path_params["user"])


@mapped
async def patch_user(req: Request) -> UserView:
    """PATCH /api/v1/users/{user}."""
    b: UserPatch = req.body
    return await users.update_user(req.db, req.actor, req.path_params["user"], name=b.name,
                                   email=b.email)


@mapped
async def delete_user(req: Request) -> UserView:
    """DELETE /api/v1/users/{user}."""
    return await removals.delete_user(req.db, req.actor, req.path_params["user"])


@mapped
async def list_members(req: Request) -> list[MemberView]:
    """GET /api/v1/members?scope=."""
    return await users.list_members(req.db, req.query.get("scope") or None)


@mapped
async def add_member(req: Request) -> MemberView:
    """POST /api/v1/members."""
    b: MemberAdd = req.body
    return await users.add_member(req.db, req.actor, b.user, b.scope, b.role)


@mapped
async def remove_member(req: Request) -> MemberView:
    """DELETE /api/v1/members/{user}?scope=."""
    scope = req.query.get("scope")
    if not scope:
        raise ApiError(400, "members.scope_required", "say which membership to remove with "
                       "?scope=org:ORG, team:ORG/TEAM or project:ORG/TEAM/PROJECT", "scope")
    return await removals.remove_member(req.db, req.actor, req.path_params["user"], scope)


_SCOPE = Param("scope", "org:ORG, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID.")

ROUTES: list[Route] = [
    Route("GET", "/api/v1/orgs", "Every organization", list_orgs, response=list[OrgView]),
    Route("POST", "/api/v1/orgs", "Add an organization", create_org, request=OrgCreate,
          response=OrgView, status=201),
    Route("GET", "/api/v1/orgs/{org}", "One organization, by ID or name", get_org,
          response=OrgView),
    Route("PATCH", "/api/v1/orgs/{org}", "Rename an organization or change its settings",
          patch_org, request=OrgPatch, response=OrgView),
    Route("DELETE", "/api/v1/orgs/{org}", "Delete an organization that has no teams",
          delete_org, response=OrgView, description="Answers with what was deleted; 409 "
          "tenancy.not_empty names the teams left."),
    Route("GET", "/api/v1/teams", "Teams, of one organization or all", list_teams,
          query=(Param("org", "Only this organization's teams (its ID or name)."),),
          response=list[TeamView]),
    Route("POST", "/api/v1/teams", "Add a team to an organization", create_team,
          request=TeamCreate, response=TeamView, status=201),
    Route("GET", "/api/v1/teams/{team}", "One team, by ID or ORG:TEAM", get_team,
          response=TeamView),
    Route("PATCH", "/api/v1/teams/{team}", "Rename, move or change a team", patch_team,
          request=TeamPatch, response=TeamView,
          description="`org` moves the team (and its projects and keys) to another organization; "
          "409 tenancy.name_taken when that organization has a team of its name."),
    Route("DELETE", "/api/v1/teams/{team}", "Delete a team that has no projects", delete_team,
          response=TeamView),
    Route("GET", "/api/v1/projects", "Projects, of one team or all", list_projects,
          query=(Param("team", "Only this team's projects (its ID or ORG/TEAM)."),),
          response=list[ProjectView]),
    Route("POST", "/api/v1/projects", "Add a project to a team", create_project,
          request=ProjectCreate, response=ProjectView, status=201),
    Route("GET", "/api/v1/projects/{project}", "One project, by ID or ORG:TEAM:PROJECT",
          get_project, response=ProjectView),
    Route("PATCH", "/api/v1/projects/{project}", "Rename, move or change a project",
          patch_project, request=ProjectPatch, response=ProjectView),
    Route("DELETE", "/api/v1/projects/{project}", "Delete a project with no unrevoked keys",
          delete_project, response=ProjectView),
    Route("GET", "/api/v1/users", "Every user", list_users, response=list[UserView]),
    Route("POST", "/api/v1/users", "Add a user", create_user, request=UserCreate,
          response=UserView, status=201),
    Route("GET", "/api/v1/users/{user}", "One user, by ID or name", get_user, response=UserView),
    Route("PATCH", "/api/v1/users/{user}", "Rename a user or change their email", patch_user,
          request=UserPatch, response=UserView),
    Route("DELETE", "/api/v1/users/{user}", "Delete a user and revoke their keys", delete_user,
          response=UserView),
    Route("GET", "/api/v1/members", "Memberships, at one scope or all", list_members,
          query=(_SCOPE,), response=list[MemberView]),
    Route("POST", "/api/v1/members", "Give a user a role at a scope", add_member,
          request=MemberAdd, response=MemberView, status=201),
    Route("DELETE", "/api/v1/members/{user}", "Remove a user from a scope", remove_member,
          query=(Param("scope", _SCOPE.description, required=True),), response=MemberView,
          description="Keys the user had in projects no other membership of theirs covers are "
          "revoked."),
]
