"""What every granian-served llmgw process shares: the ready line printed once the app answers."""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
from typing import Any

_PROBE = b"GET /health HTTP/1.1\r\nhost: llmgw-ready\r\nconnection: close\r\n\r\n"


def _answers(host: str, port: int, timeout: float) -> bool:
    """Whether (host, port) answers an HTTP request, with any status."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_PROBE)
            return s.recv(5) == b"HTTP/"
    except OSError:
        return False


def announce_when_listening(host: str, port: int, line: str, timeout: float = 60) -> None:
    """Prints `line` from a helper thread once (host, port) answers an HTTP request.

    Call it from granian's `on_startup` hook. The port accepts connections before the app
    is ready: granian's main process holds the listening socket while a worker still runs
    the app's start hook (`__rsgi_init__`: the control plane opens its store and its agent
    port there). A worker serves only after that hook returned, so an answer means the
    app started; a hook that fails ends the process without this line. Tests and
    `llmgw up` wait for it.
    """
    probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    data = (line.rstrip("\n") + "\n").encode()

    def probe() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _answers(probe_host, port, timeout=2):
                time.sleep(0.02)
                continue
            # os.write, not print: granian forks workers while this thread runs, and a
            # child must never inherit a held sys.stdout lock.
            os.write(sys.stdout.fileno(), data)
            return

    threading.Thread(target=probe, name="llmgw-ready", daemon=True).start()


_HELD: list[socket.socket] = []
"""The sockets `bind_port` holds: open until the process exits, so their ports stay its own."""


def bind_port(host: str, port: int) -> int:
    """The port a server on `host` serves on: `port`, or for 0 a free one the kernel picks.

    granian binds its listening socket from (host, port), on Linux once in every worker
    (SO_REUSEPORT), so port 0 handed to it would give each worker a port of its own and
    tell nobody which. For 0, this process binds (host, 0) itself with SO_REUSEPORT and
    keeps that socket open for its whole life, never listening on it: the port is this
    process's from the kernel's pick on, no other process can take it meanwhile, a socket
    that does not listen is given no connections, and granian's listeners join it. The
    caller passes the port returned to the app's config and its ready line, which then
    says where the server listens. Tests start servers on `--port 0` and read that line.
    """
    if port != 0:
        return port
    family, kind, proto, _, address = socket.getaddrinfo(
        host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    _HELD.append(sock)
    return int(sock.getsockname()[1])


YOUNG_COLLECTION_EVERY = 20_000
"""Allocations between the collector's young passes in a worker (CPython's default: 700)."""


def settle_worker_heap() -> None:
    """Call from granian's app factory, in the worker: tunes the cyclic collector for a server.

    Everything made so far (imported modules, configuration, route tables) lives as long as
    the worker, so it is frozen out of every later pass. And a young pass runs every
    `YOUNG_COLLECTION_EVERY` allocations rather than 700: at 10,000 requests a second the
    gateway made about 140 passes a second, which cost it 4-6% of its CPU (measured with
    `gc.callbacks`), with little to find, since its per-request objects are freed by
    reference counting. Cyclic garbage then waits for at most that many allocations.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, old)


def serve_app(target: str, host: str, port: int, line: str, *, workers: int = 1, **options: Any) -> None:
    """Serves the RSGI app factory `target` ("module:function") with granian on uvloop until
    it is told to stop, printing `line` once the app answers (`announce_when_listening`).
    `port` is a port, not 0: callers resolve 0 with `bind_port` first, so that the app's
    config and `line` name the port it got.

    Every llmgw server runs this way: the gateway, the control plane, the engines. Access
    logs are off and granian logs warnings only, so stdout carries the one ready line.
    `options` go to granian as they are (the gateway's backlog and header timeout).
    """
    from granian import Granian  # imported late: `--help` does not pay for it
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    server = Granian(target, factory=True, interface=Interfaces.RSGI, loop=Loops.uvloop,
                     workers=workers, address=host, port=port, log_access=False,
                     log_level=LogLevels.warning, **options)
    server.on_startup(lambda: announce_when_listening(host, port, line))
    server.serve()


async def read_body(protocol: Any, limit: int) -> bytes | None:
    """An RSGI request's whole body, or None once it passes `limit` bytes (reading stops there).

    For bodies without a Content-Length (chunked uploads); with one, `await protocol()`
    reads it in one call after the declared length was checked."""
    parts: list[bytes] = []
    size = 0
    async for chunk in protocol:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
