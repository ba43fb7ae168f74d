"""The gateway's two secrets: the token it shows the control plane and the key that hashes API keys.

Both are derived from the cluster secret (`<data-dir>/secret`, read by `llmgw.secrets.datadir`)
with `llmgw.secrets.keys.derive` and one label per purpose, exactly as the control plane
derives them. A gateway on another machine gets them from the environment instead:
LLMGW_GATEWAY_TOKEN and LLMGW_KEY_HASH_SECRET (hex).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw.config import ConfigError, ControlPlaneLink
from llmgw.secrets import datadir
from llmgw.secrets.keys import GATEWAY_TOKEN_LABEL, HASH_LABEL, derive

TOKEN_ENV = "LLMGW_GATEWAY_TOKEN"
HASH_KEY_ENV = "LLMGW_KEY_HASH_SECRET"


@dataclass(frozen=True)
class Credentials:
    """What a gateway worker needs to talk to the control plane and to check keys."""

    token: str
    hash_key: bytes

    def __repr__(self) -> str:
        return "Credentials(token=****, hash_key=****)"


def read_secret(data_dir: str | os.PathLike[str]) -> bytes:
    """The cluster secret from `<data_dir>/secret`, by the control plane's own rules (64 hex
    characters, owner-only)."""
    try:
        return datadir.read_secret(Path(data_dir))
    except datadir.DataDirError as e:
        raise ConfigError(f"the gateway cannot use the control plane's secret: {e}. Give the "
                          "data directory of `llmgw server` (--data-dir), or, on another machine, "
                          f"set {TOKEN_ENV} and {HASH_KEY_ENV}") from None


def load_credentials(cp: ControlPlaneLink) -> Credentials:
    """The gateway token and hash key, from the data directory or the environment."""
    if cp.data_dir is not None:
        secret = read_secret(cp.data_dir)
        return Credentials(derive(secret, GATEWAY_TOKEN_LABEL).hex(), derive(secret, HASH_LABEL))
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
