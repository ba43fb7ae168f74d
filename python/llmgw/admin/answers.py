"""How the admin API answers: the OpenAI error envelope, msgspec JSON and CSV bodies.

Every answer of the admin app goes through here, so that an error always has the
same shape (`{"error": {"message", "type", "param", "code"}}`) whatever raised it,
and so that the OpenAPI document can name the one envelope type for every 4xx/5xx.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

JSON = "application/json"
CSV = "text/csv; charset=utf-8"


class ErrorBody(msgspec.Struct, kw_only=True):
    """The inner object of an error answer."""

    message: str
    """A full sentence: what failed and what to do."""
    type: str
    """The OpenAI error type, chosen by the status (`invalid_request_error`, ...)."""
    param: str | None = None
    """The parameter or body field at fault, when there is one."""
    code: str
    """Stable and dotted, e.g. `tenancy.name_taken`: what scripts compare against."""


class ErrorEnvelope(msgspec.Struct):
    """The OpenAI error envelope: every 4xx and 5xx answer of the admin API has this body."""

    error: ErrorBody


# The OpenAI error type for each status the admin API answers with. A status
# missing here is a bug in a handler, so it falls to the generic types below.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}

_ENCODER = msgspec.json.Encoder()

# Anything a client sent that an error message repeats is cut to this length,
# so an error never reflects a whole hostile input back.
MAX_ECHO = 120


def truncate(text: str, limit: int = MAX_ECHO) -> str:
    """Shortens client input quoted in an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


def error_type(status: int) -> str:
    """The OpenAI error type for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_json(status: int, code: str, message: str, param: str | None = None) -> bytes:
    """The body of an error answer."""
    return _ENCODER.encode(ErrorEnvelope(ErrorBody(message=message, type=error_type(status),
                                                   param=param, code=code)))


def json_body(value: Any) -> bytes:
    """A handler's result as JSON (Structs, lists of them, dicts, scalars)."""
    return _ENCODER.encode(value)


def csv_body(rows: Iterable[Any], columns: Sequence[str] | None = None) -> bytes:
    """Rows (Structs or mappings) as CSV with a header row.

    `columns` picks and orders the columns; by default they are the first row's
    fields. None is an empty cell; lists and mappings are written as JSON.
    """
    builtins = [msgspec.to_builtins(r) for r in rows]
    if columns is None:
        columns = list(builtins[0]) if builtins else []
    out = io.StringIO()
    # lineterminator \n: RFC 4180 says \r\n, but every consumer reads \n and a
    # file saved by `ctl usage export` then diffs cleanly.
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for row in builtins:
        w.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue().encode()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return _ENCODER.encode(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
