"""Admin routes of API keys: issue (the key is in that one answer), list, get, change, revoke."""

from __future__ import annotations

from msgspec import UNSET, Struct, UnsetType

from llmgw.protocol.wire import Limits
from llmgw.store import keys
from llmgw.store.views import IssuedKey, KeyView

from .route import ApiError, Param, Request, Route
from .store_errors import Duration, Name, Ref, flag, mapped, seconds


class KeyCreate(Struct, forbid_unknown_fields=True, kw_only=True):
    """A key to issue in a project."""

    project: Ref
    """The project's ID or ORG/TEAM/PROJECT path."""
    name: Name
    user: Ref | None = None
    """The user (ID or name) the key is for; they must be a member covering the project."""
    ttl: Duration | None = None
    """How long the key lives; the longest allowed when absent (never, if no level sets one)."""
    limits: Limits | None = None


class KeyPatch(Struct, forbid_unknown_fields=True, kw_only=True):
    """Changes to a key; null limits clears the key's own limits."""

    name: Name | UnsetType = UNSET
    limits: Limits | UnsetType | None = UNSET


def _no_keys_in_url(req: Request) -> None:
    # A key pasted into a URL lands in proxy and shell logs; refuse it loudly rather than
    # look it up, so the habit does not form.
    for name, value in [*req.query.items(), *req.path_params.items()]:
        if value.startswith("sk-llmgw-"):
            raise ApiError(400, "keys.key_in_url",
                           f"{name} holds an API key; keys never go in URLs (they end up in "
                           "logs): revoke this key, and name keys by their ID (key_...)", name)


@mapped
async def list_keys(req: Request) -> list[KeyView]:
    """GET /api/v1/keys?project=&user=&revoked=."""
    _no_keys_in_url(req)
    return await keys.list_keys(req.db, project=req.query.get("project") or None,
                                user=req.query.get("user") or None,
                                revoked=flag(req, "revoked"))


@mapped
async def issue_key(req: Request) -> IssuedKey:
    """POST /api/v1/keys."""
    b: KeyCreate = req.body
    return await keys.issue_key(
        req.db, req.actor, project=b.project, name=b.name, user=b.user, limits=b.limits,
        ttl=seconds(b.ttl, "keys.bad_ttl", "ttl"), hash_key=req.state.hash_key,
        max_key_ttl=req.state.settings.max_key_ttl)


@mapped
async def get_key(req: Request) -> KeyView:
    """GET /api/v1/keys/{id}."""
    _no_keys_in_url(req)
    return await keys.get_key(req.db, req.path_params["id"])


@mapped
async def patch_key(req: Request) -> KeyView:
    """PATCH /api/v1/keys/{id}."""
    _no_keys_in_url(req)
    b: KeyPatch = req.body
    return await keys.update_key(req.db, req.actor, req.path_params["id"], name=b.name,
                                 limits=b.limits)


@mapped
async def revoke_key(req: Request) -> KeyView:
    """POST /api/v1/keys/{id}/revoke."""
    _no_keys_in_url(req)
    return await keys.revoke_key(req.db, req.actor, req.path_params["id"])


ROUTES: list[Route] = [
    Route("GET", "/api/v1/keys", "API keys (never the keys themselves)", list_keys,
          query=(Param("project", "Only this project's keys (its ID or ORG/TEAM/PROJECT)."),
                 Param("user", "Only this user's keys (ID or name)."),
                 Param("revoked", "true to list revoked keys too; false (default) lists the "
                       "others.", type="boolean")),
          response=list[KeyView]),
    Route("POST", "/api/v1/keys", "Issue an API key", issue_key, request=KeyCreate,
          response=IssuedKey, status=201,
          description="The answer's `key` is the only time the key is shown; llmgw keeps a keyed "
          "hash. Its lifetime is the smallest of `ttl` and the maximum key lifetime of the "
          "gateway, organization, team and project; a ttl above one of them is 400 "
          "keys.ttl_too_long."),
    Route("GET", "/api/v1/keys/{id}", "One API key", get_key, response=KeyView),
    Route("PATCH", "/api/v1/keys/{id}", "Rename a key or change its limits", patch_key,
          request=KeyPatch, response=KeyView),
    Route("POST", "/api/v1/keys/{id}/revoke", "Revoke an API key", revoke_key,
          response=KeyView, description="Gateways stop accepting it within a snapshot round "
          "trip. Revoking a revoked key answers it unchanged."),
]
