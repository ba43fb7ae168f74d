"""The HTTP side of `llmgw ctl`: one call to the admin API with the standard library.

`http.client` rather than `urllib.request`: it never reads proxy variables (an
admin token must not travel through a proxy someone set for other traffic) and
never follows a redirect to another host with the token.
"""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit


class Unreachable(Exception):
    """No answer from the server; the message is a sentence naming the URL and what to do."""


@dataclass(frozen=True)
class Answer:
    """The server's answer."""

    status: int
    content_type: str
    body: bytes


class Client:
    """Calls one control plane's admin API with a bearer token."""

    def __init__(self, server: str, token: str, timeout: float) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--server {server!r} is not an http:// or https:// URL; "
                             "example: --server http://127.0.0.1:8081")
        self.server = server.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._token = token
        self._timeout = timeout

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             body: bytes | None = None) -> Answer:
        """Sends one request; raises Unreachable when no HTTP answer came back."""
        target = self._base + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
                   "User-Agent": "llmgw-ctl"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return Answer(resp.status, resp.getheader("content-type") or "", data)
        except (OSError, http.client.HTTPException) as e:
            raise Unreachable(
                f"cannot reach the control plane at {self.server} ({_reason(e)}); start it with "
                "`llmgw server` on that machine (it listens on http://127.0.0.1:8081 by default), "
                "or point --server (or LLMGW_SERVER) at where it runs") from None
        finally:
            conn.close()


def _reason(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return "unknown host"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return str(e) or type(e).__name__
