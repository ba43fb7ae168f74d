"""A request cannot choose where the gateway connects (docs/reliability.md, `api_base`/`base_url`/
custom host; Portkey CVE-2026-110719): the gateway only ever connects to its replicas.

A listener stands in for an internal address an attacker would aim at; every field and
header naming it is sent; the answer comes from the configured replica and the listener
never sees a connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from urllib.parse import urlsplit

from tests.support.gateway import Gateway, post


def test_upstream_urls_in_a_request_are_never_connected_to(gateway: Gateway) -> None:
    accepted: list[object] = []
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.settimeout(0.2)
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    accepted.append(trap.accept()[0])

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        target = f"127.0.0.1:{trap.getsockname()[1]}"
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "api_base": f"http://{target}", "base_url": f"http://{target}/v1",
                "custom_llm_provider": "openai", "extra_body": {"api_base": f"http://{target}"}}
        headers = {"x-api-base": f"http://{target}", "x-base-url": f"http://{target}",
                   "x-forwarded-host": target, "forwarded": f"host={target}"}
        status, _, answer = post(gateway, "/v1/chat/completions", json.dumps(body).encode(), headers)
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"]
        # A Host header naming the target changes nothing either.
        u = urlsplit(gateway.url)
        with socket.create_connection((u.hostname, u.port), timeout=10) as s:
            raw = json.dumps(body).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + target.encode() + b"\r\n"
                      b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "
                      + str(len(raw)).encode() + b"\r\n\r\n" + raw)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        stop.set()
        t.join(2)
    assert accepted == [], "the gateway connected to an address a request named"
