"""The admin app in-process, with stand-in routes: path params, query types, bodies, CSV, errors."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from inline_snapshot import snapshot

from llmgw.admin.app import MAX_ADMIN_BODY, AdminApp
from llmgw.admin.meta import ROUTES as META
from llmgw.admin.openapi import document
from llmgw.admin.route import ApiError, Param, Raw, Request, Route
from llmgw.control.server import ControlPlane
from llmgw.control.settings import ServerConfig
from llmgw.secrets import datadir


class Thing(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    size: int = 1


class Row(msgspec.Struct):
    day: str
    requests: int
    model: str | None = None


async def echo(req: Request) -> dict[str, Any]:
    return {"params": req.path_params, "query": req.query, "actor": req.actor}


async def create(req: Request) -> Thing:
    assert isinstance(req.body, Thing)
    if req.body.name == "taken":
        raise ApiError(409, "things.name_taken", "a thing named taken exists; choose another name", "name")
    return req.body


async def take(req: Request) -> Thing:
    return req.body if req.body is not None else Thing("none")


async def clean(req: Request) -> dict[str, bool]:
    """What the app says of the body's strings, and whether the name holds a NUL after all."""
    assert isinstance(req.body, Thing)
    return {"text_clean": req.text_clean, "nul": "\x00" in req.body.name}


def native(data: bytes) -> Thing | None:
    """A stand-in native reader: takes bodies that say so, declines the rest."""
    return Thing("native", size=len(data)) if b"native" in data else None


async def read(req: Request) -> dict[str, Any]:
    assert isinstance(req.body, Thing)
    return {"name": req.body.name, "text_clean": req.text_clean}


async def rows(req: Request) -> list[Row]:
    return [Row("2026-11-01", 3, "llama"), Row("2026-11-02", 0)]


async def boom(req: Request) -> None:
    raise RuntimeError("secret detail sk-llmgw-xyz")


async def gone(req: Request) -> None:
    return None


async def raw(req: Request) -> Raw:
    return Raw(b"plain", "text/plain", 202)


STANDINS = [
    Route("GET", "/api/v1/things/{name}/parts/{part}", "A thing's part", echo,
          query=(Param("limit", "How many.", "integer"), Param("ratio", "A ratio.", "number"),
                 Param("on", "A flag.", "boolean"), Param("need", "Needed.", required=False))),
    Route("GET", "/api/v1/things/special/parts/{part}", "A literal beats a parameter", echo),
    Route("POST", "/api/v1/things", "Create a thing", create, request=Thing, response=Thing, status=201),
    Route("GET", "/api/v1/rows", "Rows as CSV", rows, query=(Param("format", "json or csv."),),
          response=list[Row], csv=True),
    Route("GET", "/api/v1/boom", "Fails", boom),
    Route("DELETE", "/api/v1/things/{name}", "Delete", gone, status=204),
    Route("GET", "/api/v1/raw", "Raw", raw, response=Raw),
    Route("POST", "/internal/v1/things", "Internal", take, request=Thing, response=Thing,
          internal=True, optional_body=True),
    Route("POST", "/internal/v1/clean", "Internal, reports text_clean", clean, request=Thing,
          internal=True),
    Route("POST", "/internal/v1/read", "Internal, read natively first", read, request=Thing,
          read=native, internal=True),
]


class Headers(dict[str, str]):
    pass


class Scope:
    def __init__(self, method: str, path: str, query: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.query_string = method, path, query
        self.headers = Headers({k.lower(): v for k, v in headers.items()})


class Protocol:
    def __init__(self, body: bytes, chunked: bool) -> None:
        self.body, self.chunked = body, chunked
        self.status = 0
        self.headers: dict[str, str] = {}
        self.out = b""

    async def __call__(self) -> bytes:
        return self.body

    def __aiter__(self) -> AsyncIterator[bytes]:
        async def gen() -> AsyncIterator[bytes]:
            for i in range(0, len(self.body), 65536):
                yield self.body[i:i + 65536]
        return gen()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.out = status, dict(headers), body

    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.response_bytes(status, headers, b"")


class Client:
    def __init__(self, app: AdminApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.loop = app, loop

    def __call__(self, method: str, target: str, body: bytes | None = None, token: str | None = "admin",
                 headers: dict[str, str] | None = None, chunked: bool = False) -> tuple[int, Any, dict[str, str]]:
        path, _, query = target.partition("?")
        hdrs = dict(headers or {})
        cp = self.app.control
        if token is not None:
            tok = {"admin": datadir.read_admin_token(cp.data_dir), "gateway": cp.gateway_token}.get(token, token)
            hdrs["authorization"] = f"Bearer {tok}"
        if body is not None and not chunked:
            hdrs.setdefault("content-length", str(len(body)))
        proto = Protocol(body or b"", chunked)
        self.loop.run_until_complete(self.app.__rsgi__(Scope(method, path, query, hdrs), proto))
        ctype = proto.headers.get("content-type", "")
        out: Any = json.loads(proto.out) if ctype.startswith("application/json") else proto.out.decode()
        return proto.status, out, proto.headers


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    datadir.prepare(tmp_path)
    cfg = ServerConfig(data_dir=str(tmp_path), store=f"sqlite:///{tmp_path}/db")
    cp = ControlPlane(cfg, [*META, *STANDINS])
    app = AdminApp(cp)
    loop = asyncio.new_event_loop()
    app.__rsgi_init__(loop)
    try:
        yield Client(app, loop)
    finally:
        app.__rsgi_del__(loop)
        loop.close()


def test_path_params_are_percent_decoded_segments(client: Client) -> None:
    status, body, headers = client("GET", "/api/v1/things/a%2Fb/parts/caf%C3%A9")
    assert status == 200 and body["params"] == {"name": "a/b", "part": "café"}
    assert headers["x-request-id"]
    assert client("GET", "/api/v1/things/special/parts/p")[1]["params"] == {"part": "p"}
    assert client("GET", "/api/v1/things/%ff/parts/x")[0] == 400
    assert client("GET", "/api/v1/things//parts/x")[0] == 404
    assert client("GET", "/api/v1/things/x%00/parts/x")[0] == 400


def test_query_parameters_are_checked(client: Client) -> None:
    ok = client("GET", "/api/v1/things/a/parts/b?limit=5&ratio=0.5&on=true")
    assert ok[0] == 200 and ok[1]["query"] == {"limit": "5", "ratio": "0.5", "on": "true"}
    status, body, _ = client("GET", "/api/v1/things/a/parts/b?limit=99999999999999999999")
    assert (status, body["error"]["message"]) == snapshot((
        400, "the query parameter 'limit' must be a whole number, not '99999999999999999999'"))
    status, body, _ = client("GET", "/api/v1/things/a/parts/b?lmit=5")
    assert (status, body["error"]["message"]) == snapshot((
        400, "GET /api/v1/things/{name}/parts/{part} has no query parameter 'lmit'; it takes: limit, need, "
             "on, ratio"))
    assert client("GET", "/api/v1/things/a/parts/b?ratio=nan")[0] == 400
    assert client("GET", "/api/v1/things/a/parts/b?on=maybe")[0] == 400


def test_bodies_are_decoded_with_the_field_path(client: Client) -> None:
    assert client("POST", "/api/v1/things", b'{"name": "a", "size": 2}')[:2] == (201, {"name": "a", "size": 2})
    status, body, _ = client("POST", "/api/v1/things", b'{"name": "a", "size": "big"}')
    assert (status, body) == snapshot((400, {"error": {
        "message": "the request body is invalid: Expected `int`, got `str` - at `$.size`; "
                   "GET /api/v1/openapi.json shows its schema",
        "type": "invalid_request_error", "param": "size", "code": "admin.invalid_body"}}))
    status, body, _ = client("POST", "/api/v1/things", b"{not json")
    assert status == 400 and body["error"]["code"] == "admin.invalid_json"
    status, body, _ = client("POST", "/api/v1/things", b"")
    assert status == 400 and body["error"]["code"] == "admin.body_required"
    status, body, _ = client("POST", "/api/v1/things", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and body["error"]["code"] in ("admin.invalid_json", "admin.invalid_body")
    status, body, _ = client("POST", "/api/v1/things", b'{"name": "a\\u0000"}')
    assert status == 400 and body["error"]["code"] == "admin.bad_text"
    status, body, _ = client("POST", "/api/v1/things", b'{"name": "taken"}')
    assert (status, body["error"]["code"], body["error"]["type"]) == (409, "things.name_taken", "conflict_error")


def test_bodies_past_the_limit_are_413(client: Client) -> None:
    big = b'{"name": "' + b"a" * MAX_ADMIN_BODY + b'"}'
    assert client("POST", "/api/v1/things", big)[0] == 413
    assert client("POST", "/api/v1/things", big, chunked=True)[0] == 413
    assert client("POST", "/api/v1/things", b"{}", headers={"content-length": "-1"})[0] == 413


def test_csv_unless_json_is_asked_for(client: Client) -> None:
    status, body, headers = client("GET", "/api/v1/rows")
    assert (status, headers["content-type"], body) == snapshot((200, "text/csv; charset=utf-8", """\
day,requests,model
2026-11-01,3,llama
2026-11-02,0,
"""))
    status, body, _ = client("GET", "/api/v1/rows?format=json")
    assert body == [{"day": "2026-11-01", "requests": 3, "model": "llama"},
                    {"day": "2026-11-02", "requests": 0, "model": None}]


def test_an_unexpected_exception_is_a_generic_500(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "llmgw.admin"):
        status, body, headers = client("GET", "/api/v1/boom")
    rid = headers["x-request-id"]
    assert status == 500 and body["error"]["code"] == "admin.internal_error"
    assert "sk-llmgw" not in json.dumps(body) and rid in body["error"]["message"]
    assert "RuntimeError" in caplog.text


def test_empty_and_raw_answers(client: Client) -> None:
    assert client("DELETE", "/api/v1/things/a")[:2] == (204, "")
    status, body, headers = client("GET", "/api/v1/raw")
    assert (status, body, headers["content-type"]) == (202, "plain", "text/plain")


def test_internal_routes_take_the_gateway_token_only(client: Client) -> None:
    assert client("POST", "/internal/v1/things", b'{"name": "a"}', token="gateway")[0] == 200
    assert client("POST", "/internal/v1/things", b"", token="gateway")[:2] == (200, {"name": "none", "size": 1})
    assert client("POST", "/internal/v1/things", b'{"name": "a"}', token="admin")[0] == 403
    assert client("POST", "/api/v1/things", b'{"name": "a"}', token="gateway")[0] == 403
    packed = msgspec.msgpack.encode({"name": "m"})
    status, body, _ = client("POST", "/internal/v1/things", packed, token="gateway",
                             headers={"content-type": "application/msgpack"})
    assert (status, body) == (200, {"name": "m", "size": 1})


def test_a_body_is_text_clean_only_when_it_cannot_hold_a_nul(client: Client) -> None:
    # Handlers that store every string (usage batches) skip checking each one when this holds.
    def ask(body: bytes, **kw: Any) -> Any:
        status, answer, _ = client("POST", "/internal/v1/clean", body, token="gateway", **kw)
        assert status == 200, answer
        return answer

    assert ask(b'{"name": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00"}') == {"text_clean": True, "nul": False}
    assert ask(b'{"name": "a\\u0000b"}') == {"text_clean": False, "nul": True}
    # Lone surrogates and raw control characters never decode: no clean body can hold them.
    for bad in (b'{"name": "\\ud800"}', b'{"name": "\\udc00"}', b'{"name": "a\x00b"}'):
        assert client("POST", "/internal/v1/clean", bad, token="gateway")[0] == 400
    # MessagePack strings may hold a raw NUL: never clean.
    packed = msgspec.msgpack.encode({"name": "a\x00b"})
    assert ask(packed, headers={"content-type": "application/msgpack"}) == {"text_clean": False, "nul": True}


def test_a_native_reader_goes_first_and_msgspec_takes_what_it_declines(client: Client) -> None:
    def ask(body: bytes, **kw: Any) -> Any:
        return client("POST", "/internal/v1/read", body, token="gateway", **kw)[:2]

    assert ask(b'{"native": 1}') == (200, {"name": "native", "text_clean": True})
    assert ask(b'{"name": "m"}') == (200, {"name": "m", "text_clean": True})
    assert ask(b'{"name": "m\\u0000"}') == (200, {"name": "m\x00", "text_clean": False})
    status, body = ask(b'{"name": 5}')
    assert status == 400 and "Expected `str`" in body["error"]["message"]
    # Never for MessagePack: the reader reads JSON.
    packed = msgspec.msgpack.encode({"name": "native"})
    assert ask(packed, headers={"content-type": "application/msgpack"}) == (200, {"name": "native",
                                                                              "text_clean": False})


def test_a_client_request_id_is_kept_only_when_safe(client: Client) -> None:
    assert client("GET", "/api/v1/raw", headers={"x-request-id": "abc-123"})[2]["x-request-id"] == "abc-123"
    assert client("GET", "/api/v1/raw", headers={"x-request-id": "a\nb"})[2]["x-request-id"] != "a\nb"


def test_the_document_describes_standins(client: Client) -> None:
    from openapi_spec_validator import validate

    doc = document(client.app.control.routes)
    validate(doc)  # type: ignore[arg-type]
    op = doc["paths"]["/api/v1/rows"]["get"]
    assert set(op["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert doc["paths"]["/internal/v1/things"]["post"]["security"] == [{"gatewayToken": []}]
    params = doc["paths"]["/api/v1/things/{name}/parts/{part}"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in params][:2] == [("name", "path"), ("part", "path")]


def test_a_table_with_a_route_twice_is_refused(tmp_path: Path) -> None:
    cfg = ServerConfig(data_dir=str(tmp_path), store="sqlite://:memory:")
    with pytest.raises(ValueError, match="twice"):
        AdminApp(ControlPlane(cfg, [*META, *META]))


def test_a_usage_batch_is_cleaned_unless_its_body_was_text_clean() -> None:
    from types import SimpleNamespace

    from llmgw.admin import internal
    from llmgw.protocol.wire import UsageBatch, UsageOpen
    from llmgw.store.usage_post import Post

    got: list[Post] = []

    async def ingest(post: Post) -> None:
        got.append(post)

    def post(batch: UsageBatch, text_clean: bool) -> None:
        req = Request(method="POST", path="/internal/v1/usage", path_params={}, query={}, body=batch,
                      actor="gateway", db=None, state=SimpleNamespace(ingest_usage=ingest),  # type: ignore[arg-type]
                      text_clean=text_clean)
        asyncio.run(internal.usage(req))

    def batch() -> UsageBatch:
        return UsageBatch(gateway_id="gw", opens=[UsageOpen(request_id="r1", model="m\x00", started_at=1.0,
                                                            prompt_estimate=1)])

    post(batch(), text_clean=False)
    assert got[-1].opens[0].model == "m\ufffd"
    clean = batch()
    clean.opens[0].model = "m"
    post(clean, text_clean=True)
    assert got[-1].opens is clean.opens and got[-1].opens[0].model == "m"
