"""Admin route of join tokens: what a new node's agent shows to get its certificate."""

from __future__ import annotations

from msgspec import Struct

from llmgw.config.units import format_duration
from llmgw.control.pki import Authority, PkiError
from llmgw.store import joins
from llmgw.store.joins import JoinToken

from .route import ApiError, Request, Route
from .store_errors import Duration, mapped, seconds

DEFAULT_TTL = 3600.0
MAX_TTL = 7 * 86400.0


class JoinTokenCreate(Struct, forbid_unknown_fields=True, kw_only=True):
    """A join token to make."""

    ttl: Duration | None = None
    """How long the token can be used (default 1h, at most 7d); it joins one node."""


@mapped
async def create_join_token(req: Request) -> JoinToken:
    """POST /api/v1/join-tokens."""
    b: JoinTokenCreate = req.body or JoinTokenCreate()
    ttl = seconds(b.ttl, "join.bad_ttl", "ttl") or DEFAULT_TTL
    if ttl > MAX_TTL:
        raise ApiError(400, "join.bad_ttl", f"a join token lives at most "
                       f"{format_duration(MAX_TTL)}, not {format_duration(ttl)}; make one when "
                       "the node is ready to join", "ttl")
    cp = req.state
    try:
        # Read at each call: `llmgw server init --force` may have made a new CA.
        authority = Authority(cp.data_dir)
    except PkiError as e:
        raise ApiError(409, "join.no_ca", str(e)) from None
    return await joins.create_token(req.db, req.actor, cp.join_hash_key, ttl,
                                    authority.fingerprint)


ROUTES: list[Route] = [
    Route("POST", "/api/v1/join-tokens", "Make a join token for a new node", create_join_token,
          request=JoinTokenCreate, optional_body=True, response=JoinToken, status=201,
          description="The token is in this answer only (the store keeps a keyed hash of its "
          "secret part). Run `llmgw agent --join-token TOKEN --control-plane HOST:PORT` on the "
          "node: it checks the control plane's CA against the SHA-256 in the token, then gets "
          "a certificate for its node id. A token joins one node and expires after `ttl` "
          "(default 1h, at most 7d). 409 join.no_ca when `llmgw server init` has not made "
          "the cluster CA."),
]
