"""A standby's forwarding client (admin/forward.py): what it sends, what it passes back, and its
errors when the leader cannot be reached, hangs up or is silent; on asyncio's loop and uvloop
(the control plane runs on uvloop under granian)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable, Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec
import pytest
import uvloop

from llmgw.admin import forward as fwd
from llmgw.admin.app import AdminApp

T = TypeVar("T")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    def go(coro: Coroutine[Any, Any, T]) -> T:
        if request.param == "uvloop":
            return uvloop.run(asyncio.wait_for(coro, 10))
        return asyncio.run(asyncio.wait_for(coro, 10))
    return go


async def with_leader(handler: Handler, call: Callable[[str], Awaitable[T]]) -> T:
    """`call` with the URL of a local server that runs `handler`, then until the
    connection is closed (the forwarding side closes it after each request)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
            await reader.read()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await call(f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()


def test_passes_request_and_answer(run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
    seen: list[bytes] = []

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head + await reader.readexactly(4))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nRetry-After: 3\r\n"
                     b"Set-Cookie: no\r\nContent-Length: 2\r\n\r\n{}")

    headers = {"authorization": "Bearer t", "content-type": "application/json", "cookie": "c",
               "x-request-id": "r1"}
    status, back, body = run(with_leader(leader, lambda url: fwd.forward(
        url, "POST", "/api/v1/orgs", "a=1", b"body", headers, "cp-b")))
    assert (status, back, body) == (201, [("content-type", "application/json"), ("retry-after", "3")], b"{}")
    lines = seen[0].split(b"\r\n")
    assert lines[0] == b"POST /api/v1/orgs?a=1 HTTP/1.1"
    assert set(lines[1:-2]) == {b"host: 127.0.0.1:" + lines[1].rsplit(b":", 1)[1], b"connection: close",
                                b"content-length: 4", b"x-llmgw-forwarded-by: cp-b",
                                b"authorization: Bearer t", b"content-type: application/json",
                                b"x-request-id: r1"}
    assert lines[-1] == b"body"


def test_leader_refuses(run: Callable[[Coroutine[Any, Any, Any]], Any], refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}"
    with pytest.raises(fwd.ForwardError) as e:
        run(fwd.forward(url, "GET", "/api/v1/orgs", "", b"", {}, "cp-b"))
    # The OSError's own text, which says it differently on each loop.
    assert str(e.value).startswith(f"leader {url}: [Errno {errno.ECONNREFUSED}] ")


def test_leader_hangs_up(run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    with pytest.raises(fwd.ForwardError, match="closed the connection before its answer ended"):
        run(with_leader(leader, lambda url: fwd.forward(url, "GET", "/x", "", b"", {}, "cp-b")))


def test_leader_answers_garbage(run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"NOT HTTP\r\n\r\n")

    with pytest.raises(fwd.ForwardError, match=r"^leader http://127\.0\.0\.1:\d+: "):
        run(with_leader(leader, lambda url: fwd.forward(url, "GET", "/x", "", b"", {}, "cp-b")))


def test_leader_silent(run: Callable[[Coroutine[Any, Any, Any]], Any],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fwd, "TIMEOUT", 0.3)

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pass  # reads the request and says nothing

    with pytest.raises(fwd.ForwardError, match=r"did not answer within 0\.3 s$"):
        run(with_leader(leader, lambda url: fwd.forward(url, "GET", "/x", "", b"", {}, "cp-b")))


def test_bad_leader_url() -> None:
    with pytest.raises(fwd.ForwardError, match="is not http://HOST:PORT"):
        asyncio.run(fwd.forward("https://leader:1", "GET", "/x", "", b"", {}, "cp-b"))


def test_standby_answers_503_when_the_leader_is_unreachable(
        run: Callable[[Coroutine[Any, Any, Any]], Any], refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}"
    leadership = SimpleNamespace(is_leader=False, ttl=3.0, every=1.0, id="cp-b",
                                 other_leader=lambda: SimpleNamespace(admin_url=url))
    app = AdminApp(SimpleNamespace(leadership=leadership, routes=[]))  # type: ignore[arg-type]
    scope = SimpleNamespace(method="GET", path="/api/v1/orgs", query_string="",
                            headers={"authorization": "Bearer t", "content-length": "0"})

    async def no_body() -> bytes:
        return b""

    answer = run(app.handle(scope, no_body, "rid1"))
    assert answer.status == 503 and answer.headers == [("retry-after", "1")]
    err = msgspec.json.decode(answer.body)["error"]
    assert err["code"] == "control_plane.leader_unreachable"
    assert err["message"].startswith(f"this control plane is a standby and cannot reach the leader at {url} "
                                     f"(leader {url}: ")
