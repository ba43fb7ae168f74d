"""Calling admin handlers straight from their route tables, as the admin app will: the
path matched, the body decoded into the route's type, ApiError turned into its answer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from llmgw.admin import audit, keys, tenancy
from llmgw.admin.route import ApiError, Request, Route
from llmgw.secrets.keys import HASH_LABEL, derive
from llmgw.store import Database

ROUTES: list[Route] = [*tenancy.ROUTES, *keys.ROUTES, *audit.ROUTES]


@dataclass
class Settings:
    """The part of the control plane's settings these handlers read."""

    max_key_ttl: float | None = None


@dataclass
class State:
    """A stand-in for the control plane."""

    settings: Settings
    hash_key: bytes = derive(b"k" * 32, HASH_LABEL)


def _match(method: str, path: str) -> tuple[Route, dict[str, str]]:
    for route in ROUTES:
        pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", route.path)
        m = re.fullmatch(pattern, path)
        if m and route.method == method:
            return route, m.groupdict()
    raise AssertionError(f"no route {method} {path}")


async def call(db: Database, method: str, path: str, body: Any = None,
               query: dict[str, str] | None = None, state: State | None = None,
               actor: str = "admin") -> tuple[int, Any]:
    """(status, JSON-shaped answer) of one request."""
    route, params = _match(method, path)
    decoded = None
    if route.request is not None:
        try:
            decoded = msgspec.json.decode(msgspec.json.encode(body or {}), type=route.request)
        except msgspec.ValidationError as e:
            return 400, {"error": {"message": str(e), "type": "invalid_request_error",
                                   "param": None, "code": "request.bad_body"}}
    req = Request(method=method, path=path, path_params=params, query=query or {}, body=decoded,
                  actor=actor, db=db, state=state or State(Settings()))
    try:
        answer = await route.handler(req)
    except ApiError as e:
        return e.status, {"error": {"message": e.message, "type": "invalid_request_error",
                                    "param": e.param, "code": e.code}}
    return route.status, msgspec.to_builtins(answer)
