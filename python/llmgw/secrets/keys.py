"""Secrets: deriving one key per purpose from the cluster secret, API keys and their keyed hash.

Every secret llmgw uses is derived from the one cluster secret with `derive`
and a label naming its purpose; a label is never reused for a second purpose,
so a leaked gateway token says nothing about the API-key hash key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _random

API_KEY_PREFIX = "sk-llmgw-"
"""Every API key starts with this, so scanners and people recognise one."""
API_KEY_SHOWN = 16
"""How many leading characters of a key lists show (`sk-llmgw-` and 7 more)."""
HASH_LABEL = "llmgw api-key hash v1"
"""The `derive` label of the key that hashes API keys."""
GATEWAY_TOKEN_LABEL = "llmgw gateway token v1"
"""The `derive` label of the token gateways show the control plane (hex of the derived key)."""


class Secret(str):
    """A str that prints as `****` (repr, str, format), so it never lands in a log by accident.

    The value is still the str itself: pass it where the secret is needed
    (comparisons, hashing, an Authorization header).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret('****')"

    def __str__(self) -> str:
        return "****"

    def __format__(self, spec: str) -> str:
        return "****"

    def reveal(self) -> str:
        """The secret as a plain str, for the one place that must send or show it."""
        return str.__str__(self)


def derive(secret: bytes, label: str) -> bytes:
    """A 32-byte key for one purpose: HMAC-SHA256 of `label` under the cluster `secret`."""
    return hmac.new(secret, label.encode(), "sha256").digest()


def key_hash(hash_key: bytes, key: str) -> str:
    """The hex keyed hash (BLAKE2b-256 keyed with `hash_key`) under which an API key is stored.

    A keyed hash, not a plain one: a copy of the database alone does not let
    anyone test guesses of keys.
    """
    return hashlib.blake2b(key.encode(), key=hash_key, digest_size=32).hexdigest()


def new_api_key() -> Secret:
    """A fresh API key: `sk-llmgw-` and 40 URL-safe random characters (240 bits)."""
    # token_urlsafe(30) is exactly 40 characters: 30 bytes = 240 bits, base64 without padding.
    return Secret(API_KEY_PREFIX + _random.token_urlsafe(30))


def key_prefix(key: str) -> str:
    """The part of a key lists show so a person can tell keys apart."""
    return key[:API_KEY_SHOWN]


JOIN_HASH_LABEL = "llmgw join-token hash v1"
"""The `derive` label of the key that hashes join tokens' secret parts."""
JOIN_TOKEN_PREFIX = "llmgw-join"


def new_join_token(ca_fingerprint: str) -> tuple[str, Secret, Secret]:
    """(id, secret part, whole token) of a fresh join token pinned to a CA.

    The token is `llmgw-join.ID.SECRET.CA_SHA256`: the ID finds the stored row, the
    secret (192 bits) proves the holder was given it, and the CA's SHA-256 lets the
    agent check it reached this cluster before it sends the secret anywhere.
    """
    token_id = _random.token_hex(6)
    secret = _random.token_urlsafe(24)
    return (token_id, Secret(secret),
            Secret(f"{JOIN_TOKEN_PREFIX}.{token_id}.{secret}.{ca_fingerprint}"))


def parse_join_token(text: str) -> tuple[str, Secret, str]:
    """(id, secret part, CA SHA-256) of a join token; ValueError with a sentence otherwise."""
    parts = text.strip().split(".")
    if (len(parts) != 4 or parts[0] != JOIN_TOKEN_PREFIX or not parts[1] or not parts[2]
            or len(parts[3]) != 64 or any(c not in "0123456789abcdef" for c in parts[3])):
        raise ValueError("the join token is not one `llmgw ctl nodes join-token` printed "
                         "(llmgw-join.ID.SECRET.CA_SHA256); copy it whole")
    return parts[1], Secret(parts[2]), parts[3]
