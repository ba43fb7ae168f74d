"""API keys on the request path: `Authorization: Bearer sk-llmgw-...` -> the key's entry, in memory.

The snapshot from the control plane holds only keyed hashes; a key is hashed
(blake2b under a secret derived for this purpose) and looked up in a dict.
No database, no await. Every refusal is its own sentence and never echoes the key.

One other credential: the control plane replays a kept request (`POST
/api/v1/requests/{id}/replay`) with the gateway token it shares with gateways as its
bearer and the original key's id in `x-llmgw-replay-key`; the replay runs as that key
(its limits, its usage) while the key is still in the snapshot.
"""

from __future__ import annotations

import hmac
import logging
import time
from datetime import UTC, datetime

from llmgw import _core
from llmgw.protocol.wire import KeyEntry, Limits, Snapshot
from llmgw.secrets.keys import API_KEY_PREFIX

from .errors import truncate

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

    def __init__(self, hash_key: bytes, replay_token: str | None = None) -> None:
        self._hash_key = hash_key
        self._replay = None if not replay_token else (SCHEME + replay_token).encode()
        """The header the control plane's replays carry (None: replays are refused)."""
        self.version: int | None = None
        self.keys = _core.KeyIndex(hash_key, [])
        """Key -> its entry: the keyed hash and the lookup in one native call."""
        self._entries: list[KeyEntry] = []
        self._by_id: dict[str, KeyEntry] | None = None
        """Key id -> its entry, made from `_entries` at the first replay after a load."""
        self.projects: dict[str, Limits] = {}

    def load(self, snap: Snapshot) -> None:
        """Replaces the table by a snapshot's keys (one assignment: requests see old or new)."""
        keys = _core.KeyIndex(self._hash_key, [(k.hash, k) for k in snap.keys])
        if keys.skipped:
            log.error("snapshot %d: %d keys have a stored hash that is not 64 hexadecimal digits and "
                      "cannot be used; the control plane's store holds a damaged row", snap.version, keys.skipped)
        self.keys = keys
        self._entries, self._by_id = snap.keys, None
        self.projects = snap.projects
        self.version = snap.version

    def resolve(self, authorization: str | None, query: str, now: float | None = None,
                replay_key: str | None = None) -> KeyEntry:
        """The entry of the key a request carries (or, for the control plane's replay, of
        `replay_key`); raises Unauthorized with the reason."""
        if query and _key_in_query(query):
            raise Unauthorized(IN_QUERY)
        # The header as nearly every client sends it, in one native call; anything else (a
        # key that matches nothing, another shape of header) is worked out and hashed again.
        entry: KeyEntry | None = None if authorization is None else self.keys.get_after(authorization, SCHEME)
        if entry is None:
            if self._replay is not None and authorization is not None and \
                    hmac.compare_digest(authorization.encode("utf-8", "replace"), self._replay):
                entry = self._replayed(replay_key)
            else:
                entry = self.keys.get(_other_shape(authorization))
                if entry is None:
                    raise Unauthorized(UNKNOWN)
        if entry.expires_at is not None and entry.expires_at <= (time.time() if now is None else now):
            when = datetime.fromtimestamp(entry.expires_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            raise Unauthorized(f"the API key {entry.key_id} expired at {when}; ask an operator for a new one")
        return entry

    def _replayed(self, key_id: str | None) -> KeyEntry:
        if not key_id:
            raise Unauthorized("a replay from the control plane must name the original request's key "
                               "in x-llmgw-replay-key; this control plane and gateway are of different versions")
        if self._by_id is None:  # replays are rare: no index is kept up for them at every load
            self._by_id = {k.key_id: k for k in self._entries}
        entry = self._by_id.get(key_id)
        if entry is None:
            raise Unauthorized(f"the replayed request's key {truncate(key_id)} is revoked or expired, or was removed "
                               "with its user or project, so the request cannot be replayed under it")
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
