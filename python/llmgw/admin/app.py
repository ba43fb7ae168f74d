"""The RSGI app of the control plane: the admin API (and /internal/v1) mounted from the route table.

Each request goes, in this order: find the route (404, 405 with `allow`), refuse
credentials in the query string, check the bearer token (admin token for admin
routes, gateway token for internal ones), check the query parameters against the
route's `Param`s, read and decode the body into the route's `request` type, call
the handler, encode its answer (JSON, CSV, or `Raw`). Anything that goes wrong
becomes an answer in the OpenAI error shape; an unexpected exception is a 500
with a generic message, logged with its traceback (never with the body).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import msgspec

from llmgw.control.metrics import ROUTE_FORWARDED, ROUTE_UNMATCHED
from llmgw.control.server import token_digest
from llmgw.net.serving import read_body
from llmgw.net.silent import SilentSweep
from llmgw.secrets import datadir
from llmgw.store.db import Conflict, StoreError

from .answers import CSV, JSON, csv_body, error_json, json_body, truncate
from .forward import FORWARDED, ForwardError, forward
from .matching import BadPath, Router
from .route import ApiError, Raw, Request, Route
from .store_errors import pattern_error

if TYPE_CHECKING:
    from llmgw.control.server import ControlPlane

log = logging.getLogger("llmgw.admin")

# Operators' bodies are small (a name, some limits). Gateways' usage batches carry
# request bodies when projects keep them, hence the larger internal limit.
MAX_ADMIN_BODY = 1 << 20
MAX_INTERNAL_BODY = 32 << 20
# A query string with more fields than this is not a real client.
MAX_QUERY_FIELDS = 64
# Query parameters whose name says they carry a credential: refused wherever they
# appear, because proxies, shells and access logs keep URLs.
CREDENTIAL_PARAMS = frozenset({"key", "api_key", "apikey", "token", "access_token",
                               "admin_token", "auth", "authorization", "bearer", "password"})
_INT64 = (-(1 << 63), (1 << 63) - 1)
_TRUE_FALSE = {"true": True, "false": False, "1": True, "0": False}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
"""Methods kept as a metric label; any other is counted as `other`."""
_MSGPACK = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
# Headers a handler never sees: credentials stay in this module.
_HIDDEN_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_PARAM_AT = re.compile(r" - at `\$\.?([^`]*)`$")
# Answered by every control plane itself, leader or standby; the rest of a standby's
# requests go to the leader (admin/forward.py).
LOCAL_PATHS = frozenset({"/api/v1/leader", "/health", "/metrics"})


@dataclass
class Answer:
    """What goes back: status, content type, body and extra headers."""

    status: int
    body: bytes
    content_type: str | None = JSON
    headers: list[tuple[str, str]] = field(default_factory=list)


class AdminApp:
    """The RSGI entry point (`__rsgi__`) of `llmgw server`'s one worker."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.router = Router(control.routes)
        self._rid_prefix = os.urandom(5).hex()
        self._rid_next = 0
        self._silent: SilentSweep | None = None

    # -- RSGI hooks ---------------------------------------------------------------
    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.control.start())
        # Connections that send nothing would hold granian's places until they leave: a flood
        # of them would cut every gateway off its usage posts and leases.
        config = self.control.config
        self._silent = SilentSweep.serving(config.host, config.port, config.settings.admin_header_timeout,
                                           self.control.metrics.connections_closed)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._silent is not None:
            self._silent.stop()
        loop.run_until_complete(self.control.stop())

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        started = time.perf_counter()
        rid = scope.headers.get("x-request-id")
        if not rid or not _REQUEST_ID.match(rid):
            self._rid_next += 1
            rid = f"{self._rid_prefix}{self._rid_next:08x}"
        route = [ROUTE_UNMATCHED]
        try:
            answer = await self.handle(scope, protocol, rid, route)
        except ApiError as e:
            answer = Answer(e.status, error_json(e.status, e.code, e.message, e.param))
        except Conflict:
            # A handler that let a uniqueness rule through unmapped: still a 409, and
            # the store's own text (table and constraint names) stays in the log.
            log.warning("admin %s %s: unmapped store conflict (request %s)", scope.method,
                        truncate(scope.path), rid, exc_info=True)
            answer = Answer(409, error_json(409, "store.conflict", "the change conflicts with "
                                            f"what is stored; request {rid} is in the log"))
        except StoreError:
            log.exception("admin %s %s: store failed (request %s)", scope.method, truncate(scope.path), rid)
            answer = Answer(503, error_json(503, "store.unavailable",
                                            "the control plane's store is not answering; try "
                                            f"again shortly (request {rid}; details in its log)"),
                            headers=[("retry-after", "5")])
        except Exception:
            log.exception("admin %s %s failed (request %s)", scope.method, truncate(scope.path), rid)
            answer = Answer(500, error_json(500, "admin.internal_error",
                                            "the control plane failed on this request; its log "
                                            f"has the details under request {rid}"))
        headers = [("x-request-id", rid), ("cache-control", "no-store"), *answer.headers]
        if answer.content_type is None:
            protocol.response_empty(answer.status, headers)
        else:
            protocol.response_bytes(answer.status, [("content-type", answer.content_type), *headers],
                                    answer.body)
        method = scope.method if scope.method in _METHODS else "other"
        self.control.metrics.answered(method, route[0], answer.status, time.perf_counter() - started)

    # -- the steps ----------------------------------------------------------------
    async def handle(self, scope: Any, protocol: Any, rid: str, label: list[str] | None = None) -> Answer:
        """One request, from route lookup to the encoded answer; raises ApiError for 4xx.
        `label[0]` becomes the route's path template once one matches (for the metrics)."""
        method, path = scope.method, scope.path
        label = label if label is not None else [ROUTE_UNMATCHED]
        leadership = self.control.leadership
        if leadership is not None and not leadership.is_leader and path not in LOCAL_PATHS:
            label[0] = ROUTE_FORWARDED
            return await self._forward(scope, protocol, rid)
        pairs = _query_pairs(scope.query_string)
        try:
            match = self.router.match(method, path)
        except BadPath as e:
            raise ApiError(400, "admin.bad_path", f"{e}; encode names with %XX escapes of UTF-8") from None
        if match is None:
            raise ApiError(404, "admin.not_found",
                           f"there is no route {truncate(method, 10)} {truncate(path)}; "
                           "GET /api/v1/openapi.json lists every route of this API")
        route = match.route
        if route is None:
            allowed = ", ".join(match.allowed)
            return Answer(405, error_json(405, "admin.method_not_allowed",
                                          f"{truncate(method, 10)} is not allowed on {truncate(path)}; "
                                          f"it takes {allowed}"),
                          headers=[("allow", allowed)])
        label[0] = route.path
        actor = self._authenticate(route, scope.headers.get("authorization"))
        query = _check_query(route, pairs)
        for name, value in match.params.items():
            _check_text(value, name)
        body, text_clean = await _read_body(route, scope, protocol)
        req = Request(method=method, path=path, path_params=match.params, query=query, body=body,
                      text_clean=text_clean,
                      actor=actor, db=self.control.db, state=self.control,
                      headers={k: v for k, v in scope.headers.items() if k not in _HIDDEN_HEADERS})
        result = await route.handler(req)
        if method != "GET" and not route.internal and self.control.snapshots is not None:
            # A change may revoke a key or move a limit: rebuild the gateways' snapshot
            # now rather than at the next periodic rebuild (a revoked key must stop
            # working everywhere within a second or two).
            self.control.snapshots.poke()
        return _answer(route, query, result)

    async def _forward(self, scope: Any, protocol: Any, rid: str) -> Answer:
        """A standby's answer: the leader's answer to the same request (see admin/forward.py)."""
        leadership = self.control.leadership
        assert leadership is not None
        wait = f"a failover takes up to about {leadership.ttl * 4 / 3:.0f} s"
        retry = [("retry-after", str(max(1, round(leadership.every))))]
        if scope.headers.get(FORWARDED):
            return Answer(503, error_json(
                503, "control_plane.no_leader", "this control plane is a standby and the request "
                "was already forwarded to it by another standby, so no leader is known to "
                f"either; try again shortly ({wait})"), headers=retry)
        other = leadership.other_leader()
        if other is None:
            return Answer(503, error_json(
                503, "control_plane.no_leader", "this control plane is a standby and no leader "
                f"is known right now; try again shortly ({wait}), or ask GET /api/v1/leader "
                "which control plane leads"), headers=retry)
        body = await _raw_body(scope, protocol, MAX_INTERNAL_BODY)
        headers = dict(scope.headers.items())
        headers["x-request-id"] = rid
        try:
            status, back, data = await forward(other.admin_url, scope.method, scope.path,
                                               scope.query_string, body, headers, leadership.id)
        except ForwardError as e:
            log.warning("forwarding %s %s to the leader failed: %s", scope.method,
                        truncate(scope.path), e)
            return Answer(503, error_json(
                503, "control_plane.leader_unreachable", "this control plane is a standby and "
                f"cannot reach the leader at {other.admin_url} ({e}); try again shortly "
                f"({wait})"), headers=retry)
        ctype = next((v for k, v in back if k == "content-type"), None)
        extra = [(k, v) for k, v in back if k not in ("content-type", "x-request-id")]
        if ctype is None and not data:
            return Answer(status, b"", None, extra)
        return Answer(status, data, ctype, extra)

    def _authenticate(self, route: Route, header: str | None) -> str:
        """The actor for a valid token of the route's kind; raises ApiError 401/403 otherwise."""
        if route.public:
            return "anonymous"
        cp = self.control
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "auth.missing_token", f"this route needs a bearer token: {self._where(route)}")
        digest = token_digest(token.strip())
        # Both comparisons always run, so the time taken does not say which failed.
        is_admin = hmac.compare_digest(digest, cp.admin_token_digest)
        is_gateway = hmac.compare_digest(digest, cp.gateway_token_digest)
        if route.internal:
            if is_gateway:
                return "gateway"
            if is_admin:
                raise ApiError(403, "auth.wrong_token", "this is an internal route for gateways, "
                               f"and the admin token is not accepted here: {self._where(route)}")
        else:
            if is_admin:
                return "admin"
            if is_gateway:
                raise ApiError(403, "auth.wrong_token", "the gateway token only opens the "
                               f"/internal/v1 routes; for the admin API {self._where(route)}")
        raise ApiError(401, "auth.bad_token", f"the bearer token is not valid here: {self._where(route)}")

    def _where(self, route: Route) -> str:
        """Where the token a route takes comes from (for a refusal; not built for a valid call)."""
        data_dir = self.control.data_dir
        if route.internal:
            return (f"gateways send the gateway token, derived from the cluster secret in "
                    f"{data_dir / datadir.SECRET} (give the gateway --data-dir or LLMGW_GATEWAY_TOKEN)")
        return (f"send `Authorization: Bearer <admin token>`; the admin token is in "
                f"{data_dir / datadir.ADMIN_TOKEN} on the control plane's machine")


def _query_pairs(query_string: str) -> list[tuple[str, str]]:
    """The query string's (name, value) pairs; refuses credentials in it."""
    try:
        pairs = parse_qsl(query_string, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS,
                          errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "admin.bad_query",
                       f"the query string cannot be read (more than {MAX_QUERY_FIELDS} fields, "
                       "or not percent-encoded UTF-8); send name=value pairs") from None
    for name, _ in pairs:
        if name.lower() in CREDENTIAL_PARAMS:
            raise ApiError(400, "auth.credentials_in_query",
                           f"the query parameter {truncate(name, 20)!r} looks like a credential, and "
                           "credentials go in the Authorization header (Authorization: Bearer "
                           "<token>), never in a URL, which proxies and logs keep; remove it",
                           truncate(name, 20))
    return pairs


def _check_query(route: Route, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each parameter's last value, checked against the route's Params."""
    known = {p.name: p for p in route.query}
    query: dict[str, str] = {}
    for name, value in pairs:
        p = known.get(name)
        if p is None:
            names = ", ".join(sorted(known)) if known else "none"
            raise ApiError(400, "admin.unknown_parameter",
                           f"{route.method} {route.path} has no query parameter "
                           f"{truncate(name, 40)!r}; it takes: {names}", truncate(name, 40))
        _check_text(value, name)
        _check_type(p.name, p.type, value)
        query[name] = value
    for p in route.query:
        if p.required and p.name not in query:
            raise ApiError(400, "admin.missing_parameter",
                           f"the query parameter {p.name!r} is required: {p.description}", p.name)
    return query


def _check_type(name: str, kind: str, value: str) -> None:
    ok = True
    if kind == "integer":
        ok = re.fullmatch(r"[+-]?\d{1,19}", value) is not None and _INT64[0] <= int(value) <= _INT64[1]
    elif kind == "number":
        try:
            ok = math.isfinite(float(value))
        except ValueError:
            ok = False
    elif kind == "boolean":
        ok = value.lower() in _TRUE_FALSE
    if not ok:
        raise ApiError(400, "admin.bad_parameter",
                       f"the query parameter {name!r} must be {_A[kind]}, not {truncate(value, 40)!r}",
                       name)


_A = {"integer": "a whole number", "number": "a number", "boolean": "true or false",
      "string": "text"}


def _check_text(value: str, name: str) -> None:
    # PostgreSQL's TEXT cannot hold NUL: caught here, it is a clear 400 instead of a
    # driver error deep in a handler.
    if "\x00" in value:
        raise ApiError(400, "admin.bad_text", f"{name!r} contains a NUL character; remove it", name)


async def _raw_body(scope: Any, protocol: Any, limit: int) -> bytes:
    """The request's body bytes, at most `limit` (a 413 past it, declared or sent)."""
    declared = scope.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _too_large(limit)
    data = await protocol() if declared is not None else await read_body(protocol, limit)
    if data is None or len(data) > limit:
        raise _too_large(limit)
    return bytes(data)


async def _read_body(route: Route, scope: Any, protocol: Any) -> tuple[Any, bool]:
    """The body decoded into `route.request` (None for a route without one), and whether its
    strings are known to hold no NUL and no lone surrogate (`Request.text_clean`)."""
    if route.request is None:
        return None, True
    data = await _raw_body(scope, protocol, MAX_INTERNAL_BODY if route.internal else MAX_ADMIN_BODY)
    if not data.strip():
        if route.optional_body:
            return None, True
        raise ApiError(400, "admin.body_required",
                       f"{route.method} {route.path} needs a JSON body; GET /api/v1/openapi.json "
                       "shows its schema")
    ctype = (scope.headers.get("content-type") or "").split(";")[0].strip().lower()
    if route.read is not None and ctype not in _MSGPACK:
        got = route.read(data)
        if got is not None:
            return got, True
    try:
        if ctype in _MSGPACK:
            return msgspec.msgpack.decode(data, type=route.request), False
        # Not on internal routes: a kept request body may hold an escaped NUL, which is
        # stored as the six characters of its escape, and refusing the batch would drop
        # every other record in it.
        # The one-byte search first: it runs at memory speed, the six-byte one at a tenth of
        # that (0.3 µs of a usage record's ~600 bytes), and most bodies have no backslash.
        nul = b"\\" in data and b"\\u0000" in data
        if nul and not route.internal:
            raise ApiError(400, "admin.bad_text", "the body contains a NUL character (\\u0000) "
                           "in a string; remove it")
        # msgspec refuses raw control characters, invalid UTF-8 and lone surrogate escapes
        # in JSON, so without that escape no decoded string holds a NUL or a lone surrogate.
        return msgspec.json.decode(data, type=route.request), not nul
    except msgspec.ValidationError as e:
        text = str(e)
        m = _PARAM_AT.search(text)
        # msgspec's own words would quote a regex; an operator wants the rule and the value.
        worded = pattern_error(text, m.group(1) if m else None, data) if ctype not in _MSGPACK else None
        if worded is not None:
            raise worded from None
        raise ApiError(400, "admin.invalid_body", f"the request body is invalid: {truncate(text, 300)}; "
                       "GET /api/v1/openapi.json shows its schema", m.group(1) if m else None) from None
    except msgspec.DecodeError as e:
        kind = "MessagePack" if ctype in _MSGPACK else "JSON"
        raise ApiError(400, "admin.invalid_json", f"the request body is not valid {kind}: "
                       f"{truncate(str(e))}") from None
    except RecursionError:
        raise ApiError(400, "admin.invalid_json", "the request body nests arrays or objects too "
                       "deeply to read; flatten it") from None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "admin.body_too_large",
                    f"the request body is over {limit} bytes, the most this route accepts")


def _answer(route: Route, query: dict[str, str], result: Any) -> Answer:
    if isinstance(result, Raw):
        return Answer(result.status, result.body, result.content_type)
    if result is None and route.status == 204:
        return Answer(204, b"", None)
    if route.csv and query.get("format", "csv") != "json" and isinstance(result, list):
        return Answer(route.status, csv_body(result), CSV)
    return Answer(route.status, json_body(result))
