"""The project's HTTP/1.1 client: keep-alive connection pools per upstream, on uvloop and httptools.

The gateway sends requests to replicas and calls the control plane with it; a standby
control plane forwards to its leader with it (`admin.forward`), and the bench's load
generator uses it too. Of llmgw it imports only `deadlines`, so each of them may.

Why not an HTTP client in the Rust extension: every body chunk would then cross
from a tokio thread to the event loop (`call_soon_threadsafe`, one wake-up of
the loop per chunk), and the RSGI transport that sends it on lives on the loop
anyway. An asyncio Protocol gets the bytes on the loop thread directly, httptools
parses them in C, and the Rust stream tap is called synchronously on them.

One `Exchange` is one request/response on one connection. Its waits (head, next
chunk) are bounded by deadlines on the pool's `Deadlines` (one loop timer for all of
them, shared by every pool of a gateway worker), armed only for a wait that actually
blocks: a chunk that is already buffered arms nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

import httptools

from llmgw.net.deadlines import Deadlines


class UpstreamError(Exception):
    """An upstream failure; `phase` tells where it happened."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


def _again(err: UpstreamError) -> UpstreamError:
    """A fresh exception like `err` (same class, phase and message), for `Exchange` to raise.

    An exchange keeps its error (`Exchange.error`) and never raises that one itself: a raised
    exception keeps a traceback that holds the frames it passed through, the caller's among
    them, and the caller holds the exchange: a cycle (exchange -> error -> traceback -> frame
    -> exchange) that only the cyclic collector frees, and the gateway's runs rarely. Until
    then that frame kept whatever else it held, a streamed answer's transport too, which
    granian ends only once it is released: the client got the error event, then waited for
    the end of the answer. Only failures pay for this; every subclass takes (phase, message).
    The cause (what the connection broke with) goes along: it was stored without a traceback.
    """
    again = type(err)(err.phase, str(err))
    again.__cause__ = err.__cause__
    return again


class ConnectFailed(UpstreamError):
    """The TCP connection could not be opened (refused, unreachable, timed out)."""


class UpstreamTimeout(UpstreamError):
    """A deadline passed: connect, first byte, idle or total."""


class ConnectionBroken(UpstreamError):
    """The connection closed or sent garbage before the answer was complete."""


class _Cancelled(UpstreamError):
    """The exchange was cancelled by the gateway (client gone)."""


# What a wait that passes its deadline fails with: UpstreamTimeout(phase, message).
_FIRST_BYTE: Final = ("first_byte", "no answer before the first-byte deadline")
_IDLE: Final = ("idle", "replica went silent mid-answer")
_TOTAL: Final = ("total", "total deadline passed")

_HEAD: Final = 1
_BODY: Final = 2
_DONE: Final = 3

# Stop reading from a replica when this much body is waiting for the client; the
# socket's own buffers then push back on the engine.
_PAUSE_BYTES: Final = 1 << 20


class Exchange(asyncio.Protocol):
    """One HTTP/1.1 connection to a replica, used for one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.deadlines = pool.deadlines
        self.late: tuple[str, str] = _FIRST_BYTE
        """(phase, message) of the UpstreamTimeout the wait under way fails with at its deadline."""
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.state = _DONE
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.reused = False
        self.got_bytes = False
        self.keep_alive = False

    @property
    def closed_while_idle(self) -> bool:
        """Whether a broken exchange was a kept-alive connection the server had closed while
        it sat idle: nothing of the answer came, so nothing was processed, and the request
        may go once more on a new connection (what `fetch` and the proxy do)."""
        return self.reused and not self.got_bytes

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they quack alike.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            err = ConnectionBroken("body", f"invalid HTTP from replica: {e}")
            # Without its traceback, which holds this frame and so this exchange: a cycle.
            err.__cause__ = e.with_traceback(None)
            self._fail(err)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.state != _DONE:
            why = f"connection lost: {exc}" if exc else "connection closed by replica"
            err = ConnectionBroken("body" if self.status else "head", why)
            err.__cause__ = None if exc is None else exc.with_traceback(None)  # as in data_received
            self._fail(err)

    # -- httptools callbacks ----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.state = _BODY
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_BYTES and not self.paused and self.transport:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # Read now: httptools resets the parser once a message is complete, and
        # should_keep_alive() then always says no (every request paid a connect).
        self.keep_alive = self.parser.should_keep_alive()
        self.state = _DONE
        self._wake()

    # -- the exchange -----------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: UpstreamError) -> None:
        if self.error is None:
            self.error = err
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    @staticmethod
    def _on_deadline(ex: Exchange) -> None:
        # Made only when a deadline passes: an exception a wait (~0.3 µs each, one a request).
        ex._fail(UpstreamTimeout(*ex.late))
        ex.close()

    async def _wait(self, deadline: float, late: tuple[str, str]) -> None:
        self.waiter = w = self.loop.create_future()
        self.late = late
        slot = self.deadlines.add(deadline, self, Exchange._on_deadline)
        try:
            await w
        finally:
            self.deadlines.remove(slot, self)
            self.waiter = None

    def send(self, head: bytes, body: bytes) -> None:
        """Writes one request; the connection must be idle."""
        assert self.transport is not None
        self.state = _HEAD
        self.status = 0
        self.headers = []
        self.got_bytes = False
        self.keep_alive = False
        # The parser is not made anew: httptools resets it after each complete
        # message, and a connection whose last exchange did not complete is
        # closed, never reused. (A new parser per request was 11% of the
        # worker's Python time at one client.)
        self.transport.write(head + body if len(body) < 16384 else head)
        if len(body) >= 16384:
            self.transport.write(body)

    async def read_head(self, deadline: float) -> int:
        """Waits for the response headers; returns the status."""
        while self.state == _HEAD and self.error is None:
            await self._wait(deadline, _FIRST_BYTE)
        if self.state == _HEAD and self.error is not None:
            raise _again(self.error)
        return self.status

    async def read_chunk(self, idle: float, deadline: float) -> bytes | None:
        """The next body chunk, or None at the end of the body."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                self.buffered -= len(chunk)
                if self.paused and self.buffered < _PAUSE_BYTES // 2 and self.transport:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.state == _DONE:
                return None
            if self.error is not None:
                raise _again(self.error)
            now = self.loop.time()
            if now + idle < deadline:
                await self._wait(now + idle, _IDLE)
            else:
                await self._wait(deadline, _TOTAL)

    def header(self, name: bytes) -> bytes | None:
        """A response header by lower-case name."""
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def cancel(self, reason: str = "cancelled") -> None:
        """Aborts the exchange at once: the connection is closed, the engine sees it."""
        self._fail(_Cancelled("cancel", reason))
        self.close()

    def close(self) -> None:
        """Closes the connection without waiting; it is never reused."""
        t = self.transport
        if t is not None:
            self.transport = None
            t.abort()

    def finish(self) -> None:
        """Returns the connection to its pool when it can carry another exchange."""
        if (
            self.state == _DONE
            and self.error is None
            and self.transport is not None
            and not self.chunks
            and self.keep_alive
        ):
            self.pool.put(self)
        else:
            self.close()


class Pool:
    """Idle keep-alive connections to one replica."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, max_idle: int = 512,
                 auth: str | None = None, deadlines: Deadlines | None = None) -> None:
        self.loop = loop
        self.deadlines = deadlines if deadlines is not None else Deadlines(loop)
        """Where its exchanges' waits are timed: a gateway worker's pools share one."""
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.idle: list[Exchange] = []
        self.hostport = f"{host}:{port}".encode()
        self.auth = b""
        """The `Authorization` header line every request to this replica carries (its engine
        key), or nothing."""
        if auth is not None:
            # The key goes into a header verbatim: anything but a plain token could
            # split the request, so it is refused rather than sent.
            if not auth or not auth.isascii() or not auth.isprintable() or " " in auth:
                raise ValueError("the engine key is not a plain token of printable ASCII")
            self.auth = b"Authorization: Bearer " + auth.encode() + b"\r\n"
        self.closed = False

    def put(self, ex: Exchange) -> None:
        """Keeps a finished connection for reuse (closes it once the pool is closed)."""
        if len(self.idle) < self.max_idle and not self.closed:
            ex.reused = True
            self.idle.append(ex)
        else:
            ex.close()

    async def get(self, connect_timeout: float) -> Exchange:
        """An idle connection, or a new one."""
        while self.idle:
            ex = self.idle.pop()
            if ex.transport is not None and not ex.transport.is_closing():
                return ex
        try:
            async with asyncio.timeout(connect_timeout):
                _, proto = await self.loop.create_connection(
                    lambda: Exchange(self), self.host, self.port
                )
        except TimeoutError as e:
            raise ConnectFailed("connect", f"connect to {self.host}:{self.port}: timed out") from e
        except OSError as e:
            reason = e.strerror or str(e)
            raise ConnectFailed("connect", f"connect to {self.host}:{self.port}: {reason.lower()}") from e
        return proto

    def close(self) -> None:
        """Closes every idle connection; connections in use are closed as their exchanges end."""
        self.closed = True
        for ex in self.idle:
            ex.close()
        self.idle.clear()


async def fetch(pool: Pool, head: bytes, body: bytes, timeout: float,
                connect_timeout: float) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One request on a connection of `pool`, its whole answer read: (status, headers with
    lower-case names, body). The connect must take at most `connect_timeout`, and the
    answer's last byte come within `timeout` of the call (the connect counts).

    A kept-alive connection the server closed while it sat idle (it broke before a byte of
    the answer came) is tried once more, on a new connection. Raises UpstreamError; the
    error a connection broke with, if any, is its `__cause__`.
    """
    deadline = pool.loop.time() + timeout
    fresh = False
    while True:
        ex = await pool.get(connect_timeout)
        ex.send(head, body)
        try:
            status = await ex.read_head(deadline)
            parts = []
            while (chunk := await ex.read_chunk(timeout, deadline)) is not None:
                parts.append(chunk)
        except ConnectionBroken:
            ex.close()
            if ex.closed_while_idle and not fresh:
                fresh = True
                continue
            raise
        except BaseException:
            ex.close()
            raise
        ex.finish()
        return status, ex.headers, b"".join(parts)
