"""From what the store refuses to admin API answers: one table of statuses, and the request
helpers the tenancy, keys and audit handlers share (durations, flags, path references)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import msgspec

from llmgw.durations import DURATION_PATTERN, parse_duration
from llmgw.store.errors import Kind, TenancyError, shown
from llmgw.store.names import NAME_PATTERN

from .route import ApiError, Request

STATUS: dict[Kind, int] = {"invalid": 400, "forbidden": 403, "not_found": 404, "conflict": 409}
"""Every kind of store refusal and its HTTP status; no catch-all."""

Name = Annotated[str, msgspec.Meta(
    min_length=1, max_length=63, pattern=NAME_PATTERN,
    description="1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a "
                "letter or digit, without '..'", examples=["ml-research"])]
Duration = Annotated[str, msgspec.Meta(
    max_length=40, pattern=DURATION_PATTERN,
    description="A duration: a number and a unit (s, m, h, d, w), like 90m, 24h or 30d.",
    examples=["90d"])]
Ref = Annotated[str, msgspec.Meta(
    min_length=1, max_length=200,
    description="An ID, or a path of names joined by '/' (acme/ml/chat).")]

R = TypeVar("R")


def api_error(e: TenancyError) -> ApiError:
    """The admin answer for a store refusal."""
    return ApiError(STATUS[e.kind], e.code, e.message, e.param)


def mapped(handler: Callable[[Request], Awaitable[R]]) -> Callable[[Request], Awaitable[R]]:
    """Wraps a handler so the store's refusals answer 400/403/404/409 with their code."""

    @functools.wraps(handler)
    async def run(req: Request) -> R:
        try:
            return await handler(req)
        except TenancyError as e:
            raise api_error(e) from e

    return run


def seconds(text: str | None, code: str, param: str) -> float | None:
    """A duration from a body or query as seconds (None when absent); 400 `code` when bad."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise ApiError(400, code, str(e), param) from e


def flag(req: Request, name: str, default: bool = False) -> bool:
    """A boolean query parameter: true/false/1/0; 400 otherwise."""
    text = req.query.get(name)
    if text is None or text == "":
        return default
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ApiError(400, "request.bad_flag", f"{name}={shown(text)} is not a boolean; write "
                   f"{name}=true or {name}=false", name)


def path_ref(req: Request, name: str) -> str:
    """A path parameter naming a team or project, where ':' stands for '/' (acme:ml:chat)."""
    return req.path_params[name].replace(":", "/")

