"""What a route of the admin API is: the table entry, the request a handler sees, its errors.

Every area (tenancy, keys, usage, audit, ...) exports `ROUTES: list[Route]`;
`admin/table.py` concatenates them and is the one table the app mounts and the
OpenAPI document is generated from. A handler is `async def h(req: Request) ->
Any`: it returns a msgspec Struct, a list of them, or a `Raw` answer (CSV), and
raises `ApiError` for anything the caller must fix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.store import Database


@dataclass(frozen=True)
class Param:
    """A query parameter a handler reads."""

    name: str
    description: str
    type: str = "string"
    """A JSON Schema type: string, integer, number or boolean."""
    required: bool = False


class ApiError(Exception):
    """An answer with an error status, in the OpenAI error shape, for the operator to act on.

    `code` is stable and dotted (`tenancy.name_taken`); `message` is a full
    sentence saying what failed and what to do.
    """

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


@dataclass
class Request:
    """What a handler gets: the parsed request and the control plane's state."""

    method: str
    path: str
    path_params: dict[str, str]
    query: dict[str, str]
    """Each query parameter's last value (lists are comma-separated values by convention)."""
    body: Any
    """The body decoded into the route's `request` type, or None when it has none."""
    actor: str
    """Who is asking: `admin` for the admin token; later a user's name."""
    db: Database
    state: Any
    """The control plane (`llmgw.control.server.ControlPlane`): settings, secrets, snapshot."""
    headers: dict[str, str] = field(default_factory=dict)
    text_clean: bool = False
    """The body's strings hold no NUL and no lone surrogate (JSON without a `\\u0000` escape),
    so a handler that must store them as text can skip checking each one."""


@dataclass(frozen=True)
class Raw:
    """A non-JSON answer (CSV export)."""

    body: bytes
    content_type: str
    status: int = 200


Handler = Callable[[Request], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint as the OpenAPI document describes it and the app mounts it."""

    method: str
    path: str
    """With `{name}` segments, e.g. /api/v1/orgs/{org}."""
    summary: str
    handler: Handler
    description: str = ""
    query: tuple[Param, ...] = ()
    request: Any = None
    """The body's type (a msgspec Struct); None reads no body."""
    read: Callable[[bytes], Any] | None = None
    """A native reader tried first on a JSON body: what it returns becomes the request's
    body (text known clean); None from it leaves the body to msgspec and `request`."""
    optional_body: bool = False
    response: Any = None
    """The type a success answers with, e.g. `list[OrgView]`."""
    status: int = 200
    csv: bool = False
    """The answer is CSV unless JSON is asked for (`format=json`)."""
    internal: bool = False
    """Called by gateways with the gateway token, not by operators with the admin token."""
    public: bool = False
    """Answered without a token: a probe or a scrape, which carries no secret and no tenant's
    data (GET /health, GET /metrics)."""
    media: str = "application/octet-stream"
    """The media type a `Raw` answer is documented with."""
