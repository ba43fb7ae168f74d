"""What the tenancy, keys and audit stores answer with; the admin API sends these as they are."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from llmgw.protocol.wire import Limits

Role = Literal["owner", "admin", "member", "viewer"]


def limits_json(limits: Limits | None) -> str:
    """Limits as the store keeps them (JSON text; `{}` for none)."""
    return msgspec.json.encode(limits or Limits()).decode()


def limits_of(text: str | None) -> Limits:
    """Limits from their stored JSON text."""
    return msgspec.json.decode(text or "{}", type=Limits)


class OrgView(msgspec.Struct, kw_only=True):
    """An organization, the top of the tree."""

    id: str
    name: str
    max_key_ttl: float | None
    """The longest lifetime, in seconds, of a key issued in this org; None: no maximum here."""
    limits: Limits
    created_at: float
    teams: int
    """How many teams it has."""


class TeamView(msgspec.Struct, kw_only=True):
    """A team inside an organization."""

    id: str
    name: str
    org_id: str
    path: str
    """ORG/TEAM."""
    max_key_ttl: float | None
    limits: Limits
    created_at: float
    projects: int
    """How many projects it has."""


class ProjectView(msgspec.Struct, kw_only=True):
    """A project inside a team: API keys belong to projects."""

    id: str
    name: str
    team_id: str
    org_id: str
    path: str
    """ORG/TEAM/PROJECT."""
    limits: Limits
    """Shared by all the project's keys."""
    keep_bodies: bool
    """Whether request and response bodies of its requests are kept (unless a request says no_store)."""
    max_key_ttl: float | None
    created_at: float
    keys: int
    """How many of its keys are not revoked."""


class UserView(msgspec.Struct, kw_only=True):
    """A person (or robot) keys can be issued to."""

    id: str
    name: str
    email: str | None
    created_at: float


class MemberView(msgspec.Struct, kw_only=True):
    """One membership: a user's role at an org, team or project (and everything below it)."""

    user_id: str
    user: str
    """The user's name."""
    scope: str
    """org:ORG, team:ORG/TEAM or project:ORG/TEAM/PROJECT."""
    scope_id: str
    role: Role


class KeyView(msgspec.Struct, kw_only=True):
    """An API key as lists show it: never the key, never its hash."""

    id: str
    name: str
    prefix: str
    """The key's first 16 characters, to recognise it."""
    project_id: str
    path: str
    """The project's ORG/TEAM/PROJECT."""
    user_id: str | None
    user: str | None = None
    """The user's name, while the user exists."""
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    limits: Limits


class IssuedKey(KeyView, kw_only=True):
    """A key just issued: the only answer that ever carries the key itself."""

    key: str
    """The API key. Shown this once: store it now; llmgw keeps only a hash of it."""


class AuditEvent(msgspec.Struct, kw_only=True):
    """One change made through the admin API."""

    id: str
    at: float
    actor: str
    action: str
    """What was done, like org.create or key.revoke."""
    target: str
    """What it was done to, like org:acme or a key ID."""
    before: dict[str, Any] | None
    """A summary of the thing before the change; None for a creation."""
    after: dict[str, Any] | None
    """A summary after the change; None for a deletion."""
