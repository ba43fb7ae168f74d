"""Names and IDs of the tenancy tree: the one name rule, ID minting, and parsing references.

A reference is what a caller writes to name a thing: its ID (`team_...`) or its
path (`acme/ml`). IDs and names cannot be confused: a name may not have the
shape of an ID.
"""

from __future__ import annotations

import base64
import re
import secrets
from typing import Literal

from .errors import Invalid, shown

NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$"
"""Lowercase letters, digits, `.`, `_`, `-`; 1 to 63 characters; a letter or digit at each end."""
NAME_RULE = ("a name is 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending "
             "with a letter or digit, without '..'")
_NAME = re.compile(NAME_PATTERN)
_ID = re.compile(r"^(org|team|proj|user|key)_[a-z2-7]{16}$")

ScopeKind = Literal["org", "team", "project"]
ID_PREFIX: dict[str, str] = {"org": "org_", "team": "team_", "project": "proj_", "user": "user_",
                             "key": "key_"}


def new_id(kind: str) -> str:
    """A fresh ID: the kind's prefix and 16 random lowercase base32 characters (80 bits)."""
    return ID_PREFIX[kind] + base64.b32encode(secrets.token_bytes(10)).decode().lower()


def is_id(text: str, kind: str | None = None) -> bool:
    """Whether `text` has the shape of an ID (of `kind` when given)."""
    if not _ID.match(text):
        return False
    return kind is None or text.startswith(ID_PREFIX[kind])


def check_name(name: str, what: str, param: str = "name") -> str:
    """`name` when it follows the rule; raises Invalid `tenancy.bad_name` quoting the rule."""
    # `..` is allowed by the character class but would read as a parent path in URLs and
    # logs; an ID-shaped name would make `acme` vs `org_...` references ambiguous.
    if not _NAME.match(name) or ".." in name or is_id(name):
        extra = " and not shaped like an ID" if is_id(name) else ""
        raise Invalid("tenancy.bad_name", f"{shown(name)} is not a valid {what} name: {NAME_RULE}"
                      f"{extra}; pick another, like 'ml-research'", param)
    return name


def split_path(ref: str, parts: int, what: str, param: str) -> list[str]:
    """The names in a path reference (`acme/ml` for a team: 2 parts), each checked."""
    names = ref.split("/")
    if len(names) != parts:
        example = "/".join(["acme", "ml", "chat"][:parts])
        raise Invalid("tenancy.bad_reference",
                      f"{shown(ref)} does not name a {what}: give its ID or its path, like "
                      f"{example!r}", param)
    return [check_name(n, what if i == parts - 1 else "parent", param) for i, n in enumerate(names)]


def parse_scope(text: str, param: str = "scope") -> tuple[ScopeKind, str]:
    """(kind, reference) of a scope: `org:acme`, `team:acme/ml`, `project:acme/ml/chat`,
    a kind and an ID (`team:team_...`), or a bare ID."""
    kinds: dict[str, ScopeKind] = {"org": "org", "team": "team", "project": "project"}
    kind, colon, ref = text.partition(":")
    if colon and kind in kinds and ref:
        return kinds[kind], ref
    if not colon:
        for k, prefix in (("org", "org_"), ("team", "team_"), ("project", "proj_")):
            if is_id(text) and text.startswith(prefix):
                return kinds[k], text
    raise Invalid("tenancy.bad_scope",
                  f"{shown(text)} is not a scope; write org:ORG, team:ORG/TEAM, "
                  "project:ORG/TEAM/PROJECT or an org, team or project ID", param)


def path_param(ref: str) -> str:
    """A reference from a URL path segment, where `:` stands for `/` (`acme:ml` is `acme/ml`)."""
    return ref.replace(":", "/")
