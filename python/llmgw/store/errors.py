"""What the tenancy, keys and audit stores refuse, each with a stable dotted code and a sentence.

The admin API maps `kind` to an HTTP status in one place (`llmgw.admin.store_errors`);
the store itself knows nothing of HTTP.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["invalid", "forbidden", "not_found", "conflict"]


class TenancyError(Exception):
    """A request the store refuses; `message` says what failed and what to do."""

    kind: Kind = "invalid"

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


class Invalid(TenancyError):
    """Bad input: a malformed name, duration, scope or role."""

    kind: Kind = "invalid"


class Forbidden(TenancyError):
    """Well-formed but not allowed (a key for a user who is not a member)."""

    kind: Kind = "forbidden"


class NotFound(TenancyError):
    """The org, team, project, user, membership or key named does not exist."""

    kind: Kind = "not_found"


class Taken(TenancyError):
    """The state forbids it: a name taken among siblings, a scope that is not empty."""

    kind: Kind = "conflict"


def shown(text: str, limit: int = 64) -> str:
    """User input as an error quotes it: repr'd and cut, so a huge or odd value stays readable."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
