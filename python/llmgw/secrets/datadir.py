"""The data dir's secret files: the cluster secret and the admin token, owner-only.

The control plane creates them (`prepare`); a gateway on the same machine reads the
cluster secret from them (`read_secret`). Apart from both, so that neither imports the other.

Both files are created at first start with mode 0600 (O_EXCL, so two control
planes starting together cannot write different secrets over each other), and a
start refuses to go on when either has become readable by group or others:
copying a secret around is how it leaks, and saying so beats serving with it.

File formats (a gateway elsewhere gets its secrets from the environment instead):
- `secret`: the 32-byte cluster secret as 64 lowercase hex characters and a newline;
- `admin-token`: `llmgw-admin-` + 43 urlsafe characters and a newline.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

SECRET = "secret"
ADMIN_TOKEN = "admin-token"
ADMIN_TOKEN_PREFIX = "llmgw-admin-"


class DataDirError(Exception):
    """The data dir cannot be used; the message says what to do."""


def prepare(data_dir: Path) -> None:
    """Creates the data dir (0700) and its secret files (0600) where missing; checks their modes."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise DataDirError(f"cannot create the data dir {data_dir}: {e.strerror}; "
                           "give --data-dir a directory this user can write") from e
    _create(data_dir / SECRET, secrets.token_bytes(32).hex() + "\n")
    _create(data_dir / ADMIN_TOKEN, ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32) + "\n")
    read_secret(data_dir)
    read_admin_token(data_dir)


def _create(path: Path, content: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as e:
        raise DataDirError(f"cannot create {path}: {e.strerror}") from e
    with os.fdopen(fd, "w") as f:
        f.write(content)


def _read(path: Path) -> str:
    try:
        st = path.stat()
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise DataDirError(
                f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}) and "
                f"holds a secret; run `chmod 600 {path}` and start again")
        return path.read_text().strip()
    except FileNotFoundError as e:
        raise DataDirError(f"{path} is missing; `llmgw server` creates it at its first start "
                           "in that data dir") from e
    except OSError as e:
        raise DataDirError(f"cannot read {path}: {e.strerror}") from e


def read_secret(data_dir: Path) -> bytes:
    """The cluster secret (32 bytes)."""
    path = data_dir / SECRET
    text = _read(path)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise DataDirError(f"{path} does not hold 64 hex characters; it is not an llmgw secret "
                           "(restore it from a backup: keys and tokens derive from it)")
    return raw


def read_admin_token(data_dir: Path) -> str:
    """The admin token."""
    path = data_dir / ADMIN_TOKEN
    token = _read(path)
    if not token.startswith(ADMIN_TOKEN_PREFIX) or len(token) < len(ADMIN_TOKEN_PREFIX) + 32:
        raise DataDirError(f"{path} does not hold an llmgw admin token; delete it and start "
                           "`llmgw server` again to make a new one")
    return token
