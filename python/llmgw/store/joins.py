"""Join tokens and the node certificates they bought: create, redeem once, revoke.

A join token is single use and bounded by its TTL: the join that spends it records
which node used it, and a second join with it is refused naming that node, so a
token copied from a shell history after the fact is worthless. Only the keyed hash
of its secret part is stored (as for API keys).

The certificate serials are here, not in the control plane's memory, because every
control plane on one PostgreSQL must refuse a removed node's certificate.
"""

from __future__ import annotations

import hmac
import time

import msgspec

from llmgw.secrets.keys import Secret, key_hash, new_join_token

from . import audit
from .db import Database
from .errors import Forbidden


class JoinToken(msgspec.Struct, kw_only=True):
    """A join token as created: `token` is shown this once."""

    id: str
    token: str
    expires_at: float
    ca_sha256: str


class CertState(msgspec.Struct, kw_only=True):
    """What the store knows of one node certificate."""

    node_id: str
    revoked_at: float | None


async def create_token(db: Database, actor: str, hash_key: bytes, ttl: float,
                       ca_fingerprint: str, now: float | None = None) -> JoinToken:
    """A new join token valid for `ttl` seconds (audited without its secret)."""
    now = time.time() if now is None else now
    token_id, secret, token = new_join_token(ca_fingerprint)
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO join_tokens (id, hash, created_at, expires_at) "
                         "VALUES ($1, $2, $3, $4)", token_id, key_hash(hash_key, secret.reveal()),
                         now, now + ttl)
        await audit.record(tx, actor, "join_token.create", token_id, None,
                           {"id": token_id, "expires_at": now + ttl}, at=now)
    return JoinToken(id=token_id, token=token.reveal(), expires_at=now + ttl,
                     ca_sha256=ca_fingerprint)


async def redeem(db: Database, hash_key: bytes, token_id: str, secret: Secret, node_id: str,
                 serial: str, cert_expires_at: float, now: float | None = None) -> None:
    """Spends the token and records the certificate signed for `node_id`, in one transaction;
    Forbidden (`join.bad_token`, `join.token_used`, `join.token_expired`) otherwise."""
    now = time.time() if now is None else now
    again = "; make a new one with `llmgw ctl nodes join-token` and join again"
    async with db.transaction() as tx:
        row = await tx.fetchrow("SELECT hash, expires_at, used_at, used_by FROM join_tokens "
                                "WHERE id = $1", token_id)
        if row is None or not hmac.compare_digest(row["hash"], key_hash(hash_key, secret.reveal())):
            raise Forbidden("join.bad_token", "the join token is not one this cluster issued "
                            "(or its secret part is wrong)" + again)
        if row["used_at"] is not None:
            raise Forbidden("join.token_used", f"the join token {token_id} was already used by "
                            f"node {row['used_by']}; a token joins one node" + again)
        if row["expires_at"] <= now:
            raise Forbidden("join.token_expired", f"the join token {token_id} expired "
                            f"{now - row['expires_at']:.0f} s ago" + again)
        n = await tx.execute("UPDATE join_tokens SET used_at = $2, used_by = $3 "
                             "WHERE id = $1 AND used_at IS NULL", token_id, now, node_id)
        if n != 1:  # another control plane spent it between our read and write
            raise Forbidden("join.token_used", f"the join token {token_id} was already used" + again)
        await tx.execute("INSERT INTO node_certificates (serial, node_id, token_id, issued_at, "
                         "expires_at) VALUES ($1, $2, $3, $4, $5)", serial, node_id, token_id,
                         now, cert_expires_at)


async def certificate(db: Database, serial: str) -> CertState | None:
    """The recorded state of a node certificate; None when this cluster never issued it."""
    row = await db.fetchrow("SELECT node_id, revoked_at FROM node_certificates WHERE serial = $1",
                            serial)
    return None if row is None else CertState(node_id=row["node_id"], revoked_at=row["revoked_at"])


async def revoke_node(db: Database, node_id: str, now: float | None = None) -> int:
    """Revokes every certificate of `node_id` (it was removed); returns how many."""
    now = time.time() if now is None else now
    return await db.execute("UPDATE node_certificates SET revoked_at = $2 "
                            "WHERE node_id = $1 AND revoked_at IS NULL", node_id, now)
