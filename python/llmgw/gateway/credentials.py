"""The gateway's two secrets: the token it shows the control plane and the key that hashes API keys.

Both are derived from the cluster secret (`<data-dir>/secret`) with one label per
purpose, as `llmgw.secrets` does on the control plane's side (the lead dedupes the
two small functions below into it). A gateway on another machine gets them from the
environment instead: LLMGW_GATEWAY_TOKEN and LLMGW_KEY_HASH_SECRET (hex).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from llmgw.config import ConfigError, ControlPlane

TOKEN_ENV = "LLMGW_GATEWAY_TOKEN"
HASH_KEY_ENV = "LLMGW_KEY_HASH_SECRET"
GATEWAY_TOKEN_LABEL = "llmgw gateway token v1"
KEY_HASH_LABEL = "llmgw api-key hash v1"


def derive(secret: bytes, label: str) -> bytes:
    """A secret for one purpose: HMAC-SHA256 of the label under the cluster secret."""
    return hmac.new(secret, label.encode(), "sha256").digest()


def key_hash(key: str, hash_key: bytes) -> str:
    """The keyed hash an API key is stored and looked up by (hex)."""
    return hashlib.blake2b(key.encode(), key=hash_key, digest_size=32).hexdigest()


@dataclass(frozen=True)
class Credentials:
    """What a gateway worker needs to talk to the control plane and to check keys."""

    token: str
    hash_key: bytes

    def __repr__(self) -> str:
        return "Credentials(token=****, hash_key=****)"


def read_secret(data_dir: str | os.PathLike[str]) -> bytes:
    """The cluster secret from `<data_dir>/secret` (raw bytes, or hex text)."""
    path = Path(data_dir) / "secret"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"cannot read the control plane's secret {path}: {e.strerror}; give the data directory of "
            f"`llmgw server` (--data-dir), or set {TOKEN_ENV} and {HASH_KEY_ENV}"
        ) from None
    text = raw.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    if len(raw) < 32:
        raise ConfigError(f"the secret in {path} is {len(raw)} bytes; it must be at least 32")
    return raw


def load_credentials(cp: ControlPlane) -> Credentials:
    """The gateway token and hash key, from the data directory or the environment."""
    if cp.data_dir is not None:
        secret = read_secret(cp.data_dir)
        return Credentials(derive(secret, GATEWAY_TOKEN_LABEL).hex(), derive(secret, KEY_HASH_LABEL))
    token = os.environ.get(TOKEN_ENV, "")
    hexkey = os.environ.get(HASH_KEY_ENV, "")
    if not token or not hexkey:
        raise ConfigError(
            f"the gateway needs the control plane's secret: give --data-dir (the directory of "
            f"`llmgw server`), or set {TOKEN_ENV} and {HASH_KEY_ENV}"
        )
    try:
        hash_key = bytes.fromhex(hexkey)
    except ValueError:
        raise ConfigError(f"{HASH_KEY_ENV} must be hex (64 characters)") from None
    return Credentials(token, hash_key)
