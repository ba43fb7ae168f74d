"""A standby's admin API: every /api and /internal request is passed to the leader as is.

A standby holds none of the state the admin API answers from (the fleet, the
limits authority, usage settling run on the leader only), so it forwards the
method, path, query string, body and the headers that matter (Authorization,
content type, request id) and gives back the leader's status, body and headers.
Tokens are checked by the leader: both control planes derive them from the same
data dir.

It is sent with the project's HTTP/1.1 client (`llmgw.net.client.fetch`, on the
running loop: uvloop under granian), the project's one HTTP client. One connection
per request, closed after the answer (a `Pool` that keeps none): forwarding is for
the moments after a failover and for clients that know only a standby, not a hot
path, and kept-alive sockets would point at a leader that may be gone. The timeout
is longer than the snapshot long-poll (20 s) that gateways send through it.
A request that already passed through a standby is not forwarded again: two
standbys that each think the other leads answer 503 rather than loop.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from llmgw.net.client import (
    ConnectFailed,
    ConnectionBroken,
    Pool,
    UpstreamError,
    UpstreamTimeout,
    fetch,
)

FORWARDED = "x-llmgw-forwarded-by"
"""Set on a forwarded request, with the forwarding control plane's id."""
TIMEOUT = 60.0
_PASS = ("authorization", "content-type", "accept", "x-request-id")
_BACK = (b"content-type", b"retry-after", b"allow", b"x-request-id")


class ForwardError(Exception):
    """The leader could not be reached or answered garbage; a short phrase that chains."""


async def forward(leader_url: str, method: str, path: str, query: str, body: bytes,
                  headers: dict[str, str], via: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers to pass back, body) of the same request sent to `leader_url`."""
    u = urlsplit(leader_url)
    if u.scheme != "http" or not u.hostname:
        raise ForwardError(f"leader url {leader_url!r} is not http://HOST:PORT")
    target = path + (f"?{query}" if query else "")
    lines = [f"{method} {target} HTTP/1.1", f"host: {u.netloc}", "connection: close",
             f"content-length: {len(body)}", f"{FORWARDED}: {via}"]
    lines += [f"{k}: {headers[k]}" for k in _PASS if k in headers]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    # The running loop, whichever it is: uvloop under granian, asyncio's own in tests. Keeps
    # no connection (max_idle=0): the one it opens is closed once the answer is read.
    pool = Pool(asyncio.get_running_loop(), u.hostname, u.port or 80, max_idle=0)
    try:
        status, back, data = await fetch(pool, head, body, TIMEOUT, TIMEOUT)
    except UpstreamTimeout:
        raise ForwardError(f"leader {leader_url} did not answer within {TIMEOUT:g} s") from None
    except (ConnectFailed, ConnectionBroken) as e:
        cause = e.__cause__
        if isinstance(cause, TimeoutError):  # the connect
            raise ForwardError(f"leader {leader_url} did not answer within {TIMEOUT:g} s") from None
        if cause is None:
            raise ForwardError(f"leader {leader_url} closed the connection before its answer ended") from e
        # An OSError (refused, reset, unknown host) or invalid HTTP (httptools' error).
        raise ForwardError(f"leader {leader_url}: {cause}") from cause
    except UpstreamError as e:
        raise ForwardError(f"leader {leader_url}: {e}") from e
    finally:
        pool.close()
    return status, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in back if k in _BACK], data
