"""Every error status of the data plane, in the OpenAI error shape."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from tests.support.gateway import Gateway, post
from tests.support.procs import Proc

CHAT = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}).encode()


def assert_error(body: Any, code: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"].endswith((".", ")")) or len(body["error"]["message"]) > 20


def test_unknown_model_is_404(gateway: Gateway) -> None:
    status, headers, body = post(
        gateway, "/v1/chat/completions", b'{"model":"gpt-9","messages":[]}'
    )
    assert status == 404 and "x-request-id" in headers
    assert_error(body, "model_not_found")
    assert body["error"]["param"] == "model"


def test_malformed_json_is_400_with_the_position(gateway: Gateway) -> None:
    status, _, body = post(
        gateway, "/v1/chat/completions", b'{"model": "sim-model", "messages": [}'
    )
    assert status == 400
    assert_error(body, "invalid_json")
    assert "byte 36" in body["error"]["message"]


def test_missing_model_is_400_naming_the_field(gateway: Gateway) -> None:
    status, _, body = post(gateway, "/v1/chat/completions", b'{"messages": []}')
    assert status == 400 and body["error"]["param"] == "model"


def test_body_over_the_limit_is_413(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"max_body_bytes": 1000})
    big = json.dumps({"model": "sim-model", "prompt": "x" * 2000}).encode()
    status, _, body = post(gw, "/v1/completions", big)
    assert status == 413
    assert_error(body, "body_too_large")


def test_a_chunked_body_over_the_limit_is_413(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"max_body_bytes": 1000})
    u = urlsplit(gw.url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    part = json.dumps({"model": "sim-model", "prompt": "x" * 2000}).encode()
    conn.request("POST", "/v1/completions", body=iter([part[:500], part[500:]]),
                 headers={"content-type": "application/json"}, encode_chunked=True)
    r = conn.getresponse()
    body = json.loads(r.read())
    conn.close()
    assert r.status == 413
    assert_error(body, "body_too_large")


def test_no_healthy_replica_is_503_with_retry_after(
    gateway_factory: Callable[..., Gateway], refused_port: int,
) -> None:
    gw = gateway_factory([f"r1=http://127.0.0.1:{refused_port}=sim-model"], {"retries": 0})
    # The first health probe or the first connect error takes the replica out.
    first = post(gw, "/v1/chat/completions", CHAT)
    assert first[0] in (502, 503)
    status, headers, body = post(gw, "/v1/chat/completions", CHAT)
    assert status == 503 and headers["retry-after"] == "1"
    assert_error(body, "no_healthy_replica")


def test_upstream_failure_is_502(gateway: Gateway) -> None:
    status, _, body = post(gateway, "/v1/chat/completions", CHAT, {"x-sim-fault": "fail=500"})
    assert status == 502
    assert_error(body, "upstream_failed")
    assert "r1" in body["error"]["message"]
    rec = gateway.usage(1)[0]
    assert rec["status"] == "upstream_error" and rec["http_status"] == 502


def test_upstream_timeout_is_504(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory(
        [f"r1={sim.url}=sim-model"], {"timeouts": {"first_byte": 0.5}, "retries": 0}
    )
    status, _, body = post(gw, "/v1/chat/completions", CHAT, {"x-sim-fault": "hang"})
    assert status == 504
    assert_error(body, "upstream_timeout")
    assert gw.usage(1)[0]["status"] == "timeout"


def test_unknown_route_and_method(gateway: Gateway) -> None:
    u = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    conn.request("GET", "/v1/chat/completions")
    r = conn.getresponse()
    assert r.status == 405 and json.loads(r.read())["error"]["code"] == "method_not_allowed"
    conn.request("GET", "/nope")
    r = conn.getresponse()
    r.read()
    conn.close()
    assert r.status == 404 and r.getheader("x-request-id")


def test_busy_replicas_are_tried_then_429(gateway_factory: Callable[..., Gateway]) -> None:
    from tests.support.gateway import start_sim

    with start_sim("--model", "sim-model") as a, start_sim("--model", "sim-model") as b:
        gw = gateway_factory([f"a={a.url}=sim-model", f"b={b.url}=sim-model"])
        status, headers, body = post(gw, "/v1/chat/completions", CHAT, {"x-sim-fault": "fail=429"})
        assert status == 429 and headers["retry-after"] == "1"
        assert_error(body, "replicas_busy")
        rec = gw.usage(1)[0]
        assert rec["retries"] == 1 and rec["status"] == "busy"
        # Busy is not broken: neither replica was ejected.
        assert gw.metric("llmgw_replica_healthy", replica="a") == 1
        assert gw.metric("llmgw_replica_healthy", replica="b") == 1


def test_deeply_nested_json_is_400(gateway: Gateway) -> None:
    deep = b'{"model": "sim-model", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    status, _, body = post(gateway, "/v1/chat/completions", deep)
    assert status == 400
    assert_error(body, "invalid_json")
    assert "too deeply" in body["error"]["message"]


def test_oversized_or_too_many_headers_are_431_before_anything_is_read(gateway: Gateway) -> None:
    import socket

    u = urlsplit(gateway.url)
    for headers in (b"X-Big: " + b"a" * 2_000_000 + b"\r\n",
                    b"".join(b"X-H%d: v\r\n" % i for i in range(200))):
        with socket.create_connection((u.hostname, u.port), timeout=10) as s:
            try:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
                got = s.recv(100)
            except (BrokenPipeError, ConnectionResetError):
                # Answered and closed while 2 MB were still being sent: the reset can
                # overtake the 431, and it is a refusal all the same.
                got = b"HTTP/1.1 431 (reset)"
        assert got.startswith(b"HTTP/1.1 431"), got
    # The gateway goes on serving.
    status, _, _ = post(gateway, "/v1/chat/completions", json.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode())
    assert status == 200


def test_an_event_that_never_ends_is_cut_at_max_response_bytes(gateway_factory: Callable[..., Gateway]) -> None:
    import socket
    import threading

    # A broken "engine": 200 text/event-stream, then bytes with no event boundary, forever.
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    if conn.recv(65536).startswith(b"GET"):  # health probes: healthy
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        continue
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")
                    chunk = b"data: " + b"x" * 8192
                    while not stop.is_set():
                        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:
                    continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        gw = gateway_factory([f"bad=http://127.0.0.1:{port}=sim-model"],
                             {"max_response_bytes": 100_000, "retries": 0, "health": {"probe_interval": 60}})
        body = json.dumps({"model": "sim-model", "messages": [], "stream": True}).encode()
        status, _, err = post(gw, "/v1/chat/completions", body)
        assert status == 502
        assert "never ended" in err["error"]["message"]
    finally:
        stop.set()
        srv.close()
