"""From what the store refuses to admin API answers: one table of statuses, and the request
helpers the tenancy, keys and audit handlers share (durations, flags, path references)."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import msgspec

from llmgw.config.units import DURATION_PATTERN, DURATION_RULE, parse_duration
from llmgw.store.errors import Kind, TenancyError, shown
from llmgw.store.names import NAME_PATTERN, NAME_RULE

from .route import ApiError, Request

STATUS: dict[Kind, int] = {"invalid": 400, "forbidden": 403, "not_found": 404, "conflict": 409}
"""Every kind of store refusal and its HTTP status; no catch-all."""

Name = Annotated[str, msgspec.Meta(
    min_length=1, max_length=63, pattern=NAME_PATTERN,
    description="1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a "
                "letter or digit, without '..'", examples=["ml-research"])]
Duration = Annotated[str, msgspec.Meta(
    max_length=40, pattern=DURATION_PATTERN,
    description=f"A duration: {DURATION_RULE}.",
    examples=["90d"])]
EMAIL_PATTERN = r"^[^@\s\x00-\x1f\x7f]{1,64}@[^@\s\x00-\x1f\x7f]{1,190}$"
Email = Annotated[str, msgspec.Meta(max_length=255, pattern=EMAIL_PATTERN, examples=["alice@example.com"])]
Ref = Annotated[str, msgspec.Meta(
    min_length=1, max_length=200,
    description="An ID, or a path of names joined by '/' (acme/ml/chat).")]

R = TypeVar("R")

# A body field failing one of these patterns is answered with the rule in words and the
# value sent, not with msgspec's words (which quote the regex): (code, what, rule).
_RULES = {
    NAME_PATTERN: ("tenancy.bad_name", "name", f"{NAME_RULE}; pick another, like 'ml-research'"),
    DURATION_PATTERN: ("admin.bad_duration", "duration", f"a duration is {DURATION_RULE}"),
    EMAIL_PATTERN: ("users.bad_email", "email address", "give one like alice@example.com"),
}
_NAME_LENGTH = re.compile(r"^Expected `str` of length (>= 1|<= 63) ")
"""msgspec's words for a `Name` out of its bounds (checked before its pattern)."""
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def pattern_error(message: str, field: str | None, data: bytes) -> ApiError | None:
    """A 400 in words for msgspec's `message` about the body field at `field` (`limits.rpm`,
    `models[0].name`) when it failed one of the patterns above (or a name's length); None
    for any other validation error. `data` is the body, read again only here for the value."""
    for pattern, found in _RULES.items():
        if f"regex {pattern!r}" in message:
            code, what, rule = found
            break
    else:
        if not (field and _NAME_LENGTH.match(message) and field.rsplit(".", 1)[-1] == "name"):
            return None
        code, what, rule = _RULES[NAME_PATTERN]
    where = f"`{field}`" if field else "the body"
    value = _value_at(data, field or "")
    said = f"{shown(value)} in {where}" if isinstance(value, str) else where
    return ApiError(400, code, f"{said} is not a valid {what}: {rule}", field)


def _value_at(data: bytes, field: str) -> object:
    """The value at `field` in the JSON body `data`, or None where there is none."""
    try:
        value: object = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    for m in _STEP.finditer("." + field):
        key, index = m.group(1), m.group(2)
        if key is not None and isinstance(value, dict):
            value = value.get(key)
        elif index is not None and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return None
    return value


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

