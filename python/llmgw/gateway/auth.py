"""API keys on the request path: `Authorization: Bearer sk-llmgw-...` -> the key's entry, in memory.

The snapshot from the control plane holds only keyed hashes; a key is hashed
(blake2b under a secret derived for this purpose) and looked up in a dict.
No database, no await. Every refusal is its own sentence and never echoes the key.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from llmgw import _core
from llmgw.secrets import API_KEY_PREFIX
from llmgw.wire import KeyEntry, Limits, Snapshot

log = logging.getLogger("llmgw.gateway")

KEY_LENGTH = len(API_KEY_PREFIX) + 40
SCHEME = "Bearer "
"""How nearly every client sends a key: `Bearer sk-llmgw-...`, looked up without splitting the header."""

# Query parameters under which clients (and some SDKs) put keys: a key in a URL ends up
# in access logs and browser histories, so such a request is refused, not served.
_QUERY_NAMES = frozenset({"key", "api_key", "api-key", "apikey", "access_token", "token", "authorization"})

NO_KEY = ("this gateway requires an API key: send it as the header `Authorization: Bearer sk-llmgw-...` "
          "(`llmgw ctl keys issue` makes one)")
MALFORMED = ("the Authorization header is not `Bearer sk-llmgw-...` followed by 40 characters; "
             "send the whole key as `llmgw ctl keys issue` printed it")
UNKNOWN = ("the API key is not valid here: it was revoked or never issued by this control plane; "
           "ask an operator for a key (`llmgw ctl keys issue`)")
IN_QUERY = ("API keys are not accepted in the URL, where logs keep them; send the key as the header "
            "`Authorization: Bearer sk-llmgw-...` and revoke the one just sent")


class Unauthorized(Exception):
    """The request is refused with 401; the message is for the client."""


class KeyTable:
    """The keys and project limits of the current snapshot, by keyed hash."""

    def __init__(self, hash_key: bytes) -> None:
        self._hash_key = hash_key
        self.version: int | None = None
        self.keys = _core.KeyIndex(hash_key, [])
        """Key -> its entry: the keyed hash and the lookup in one native call."""
        self.projects: dict[str, Limits] = {}

    def load(self, snap: Snapshot) -> None:
        """Replaces the table by a snapshot's keys (one assignment: requests see old or new)."""
        keys = _core.KeyIndex(self._hash_key, [(k.hash, k) for k in snap.keys])
        if keys.skipped:
            log.error("snapshot %d: %d keys have a stored hash that is not 64 hexadecimal digits and "
                      "cannot be used; the control plane's store holds a damaged row", snap.version, keys.skipped)
        self.keys = keys
        self.projects = snap.projects
        self.version = snap.version

    def resolve(self, authorization: str | None, query: str, now: float | None = None) -> KeyEntry:
        """The entry of the key a request carries; raises Unauthorized with the reason."""
        if query and _key_in_query(query):
            raise Unauthorized(IN_QUERY)
        # The header as nearly every client sends it, in one native call; anything else (a
        # key that matches nothing, another shape of header) is worked out and hashed again.
        entry: KeyEntry | None = None if authorization is None else self.keys.get_after(authorization, SCHEME)
        if entry is None:
            entry = self.keys.get(_other_shape(authorization))
            if entry is None:
                raise Unauthorized(UNKNOWN)
        if entry.expires_at is not None and entry.expires_at <= (time.time() if now is None else now):
            when = datetime.fromtimestamp(entry.expires_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            raise Unauthorized(f"the API key {entry.key_id} expired at {when}; ask an operator for a new one")
        return entry


def _other_shape(authorization: str | None) -> str:
    """The key of a header not found as `Bearer <key>` (another case of the scheme, spaces
    around the key, or the usual shape with a key that matches nothing); raises Unauthorized
    when it holds none."""
    if not authorization:
        raise Unauthorized(NO_KEY)
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    # The shape only; other characters simply match no hash (checking the alphabet
    # here cost more than the hash lookup it would save).
    if scheme.lower() != "bearer" or len(key) != KEY_LENGTH or not key.startswith(API_KEY_PREFIX):
        raise Unauthorized(MALFORMED)
    return key


def _key_in_query(query: str) -> bool:
    low = query.lower()
    return API_KEY_PREFIX in low or any(p.partition("=")[0] in _QUERY_NAMES for p in low.split("&"))
