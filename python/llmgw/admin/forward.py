"""A standby's admin API: every /api and /internal request is passed to the leader as is.

A standby holds none of the state the admin API answers from (the fleet, the
limits authority, usage settling run on the leader only), so it forwards the
method, path, query string, body and the headers that matter (Authorization,
content type, request id) and gives back the leader's status, body and headers.
Tokens are checked by the leader: both control planes derive them from the same
data dir.

One connection per request, closed after the answer: forwarding is for the
moments after a failover and for clients that know only a standby, not a hot
path, and a pool would keep sockets to a leader that may be gone. The timeout
is longer than the snapshot long-poll (20 s) that gateways send through it.
A request that already passed through a standby is not forwarded again: two
standbys that each think the other leads answer 503 rather than loop.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httptools

FORWARDED = "x-llmgw-forwarded-by"
"""Set on a forwarded request, with the forwarding control plane's id."""
TIMEOUT = 60.0
_PASS = ("authorization", "content-type", "accept", "x-request-id")
_BACK = ("content-type", "retry-after", "allow", "x-request-id")


class ForwardError(Exception):
    """The leader could not be reached or answered garbage; a short phrase that chains."""


class _Response:
    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


async def forward(leader_url: str, method: str, path: str, query: str, body: bytes,
                  headers: dict[str, str], via: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers to pass back, body) of the same request sent to `leader_url`."""
    u = urlsplit(leader_url)
    if u.scheme != "http" or not u.hostname:
        raise ForwardError(f"leader url {leader_url!r} is not http://HOST:PORT")
    host, port = u.hostname, u.port or 80
    target = path + (f"?{query}" if query else "")
    lines = [f"{method} {target} HTTP/1.1", f"host: {u.netloc}", "connection: close",
             f"content-length: {len(body)}", f"{FORWARDED}: {via}"]
    lines += [f"{k}: {headers[k]}" for k in _PASS if k in headers]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    resp = _Response()
    parser = httptools.HttpResponseParser(resp)
    try:
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(head + body)
                await writer.drain()
                while not resp.done:
                    data = await reader.read(65536)
                    if not data:
                        break
                    parser.feed_data(data)
            finally:
                writer.close()
    except TimeoutError:
        raise ForwardError(f"leader {leader_url} did not answer within {TIMEOUT:g} s") from None
    except (OSError, httptools.HttpParserError) as e:
        raise ForwardError(f"leader {leader_url}: {e}") from e
    if not resp.done:
        raise ForwardError(f"leader {leader_url} closed the connection before its answer ended")
    back = [(k, v) for k, v in resp.headers if k in _BACK]
    return parser.get_status_code(), back, b"".join(resp.body)
