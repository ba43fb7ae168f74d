"""Back-pressure on a client that does not read its streamed answer.

granian's stream transport queues whatever `send_bytes` is given, without bound, and never
tells the sender that the client has fallen behind. A client that stopped reading an SSE
answer therefore made the gateway hold the rest of that answer in memory, however long.
The kernel still knows how far behind the client is: the bytes waiting in the connection's
send queue, and the bytes the client's side has taken so far (`tcpi_bytes_acked`).

Once a stream has sent `WATCH_AFTER` bytes (a long answer), the relay asks the kernel about
its connection every `CHECK_EVERY` bytes (`llmgw.net.connections.TcpDiag`, by the scope's two
addresses; HTTP/1.1 only, where a connection carries one answer at a time). Past `limit`
bytes waiting (or half the send buffer, when that is less) it stops reading from the
replica and waits for the queue to shrink. If the client's side takes no byte for `idle`
seconds meanwhile (its receive window stays shut), the stream is ended: `ClientStalled`;
the relay cancels the engine's request, bills the tokens produced, and shuts the
connection down, which frees what granian and the kernel still held for it.

What the gateway holds for a stalled client is then about `limit`, plus what the kernel
buffers, instead of the whole answer, and only until the idle timeout. HTTP/2 streams are
not watched: their flow control is per stream, inside one connection that other streams
share.
"""

from __future__ import annotations

import asyncio

from llmgw.net.connections import Ends, TcpDiag, address

WATCH_AFTER = 256 << 10
"""Bytes a stream sends before its connection is watched: short answers never pay for it."""
BEHIND_LIMIT = 256 << 10
"""Bytes a client may leave unread in its connection's send queue before the stream waits."""
CHECK_EVERY = 16 << 10
"""Bytes sent between two looks at the connection's send queue."""
NEVER = 1 << 62
"""More bytes than any answer: where a stream that is never watched would be checked."""
POLL = 0.05
"""Seconds between two looks while the relay waits for the queue to shrink."""


class ClientStalled(Exception):
    """The client read nothing of its answer for the idle timeout."""

    def __init__(self, message: str, ends: Ends | None) -> None:
        super().__init__(message)
        self.ends = ends
        """Its connection's (local, peer) addresses."""


class Watch:
    """One streamed answer's view of its client's connection."""

    __slots__ = ("_diag", "_ends", "_next", "idle", "limit")

    def __init__(self, diag: TcpDiag, server: str | None, client: str | None,
                 limit: int, idle: float) -> None:
        local, peer = address(server), address(client)
        self._ends = None if local is None or peer is None else (local, peer)
        self._diag = diag
        self.limit = limit
        self.idle = idle
        self._next = 0 if self._ends is not None else NEVER  # no addresses: never watched

    def _behind(self) -> tuple[int, int] | None:
        """(bytes waiting, bytes the client's side took) while the client is far behind."""
        assert self._ends is not None
        seen = self._diag.queue(self._ends)
        if seen is None:
            return None
        waiting, sndbuf, acked = seen
        # The kernel grows a connection's send buffer as it needs (up to net.ipv4.tcp_wmem's
        # last figure): a queue can stop short of `limit` while its buffer is small.
        return (waiting, acked) if waiting >= min(self.limit, sndbuf // 2) else None

    async def check(self, sent: int, deadline: float) -> None:
        """After `sent` bytes of the answer went to the transport: waits while the client is
        far behind, and raises ClientStalled once its side has taken nothing for `idle` s.
        Waits no later than `deadline` (the loop's clock): the request's own deadline, which
        the relay enforces at its next read."""
        if sent < self._next:
            return
        self._next = sent + CHECK_EVERY
        seen = self._behind()
        if seen is None:
            return
        loop = asyncio.get_running_loop()
        acked, moved_at = seen[1], loop.time()
        while loop.time() < deadline:
            await asyncio.sleep(POLL)
            seen = self._behind()
            if seen is None:
                return
            now = loop.time()
            if seen[1] != acked:  # the client took more: it reads, however slowly
                acked, moved_at = seen[1], now
            elif now - moved_at >= self.idle:
                raise ClientStalled(f"the client read nothing of its streamed answer for {self.idle:g}s "
                                    f"with {seen[0]} bytes waiting for it", self._ends)
