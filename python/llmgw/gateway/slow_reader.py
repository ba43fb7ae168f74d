"""Back-pressure on a client that does not read its streamed answer (RELIABILITY A, slow reader).

granian's stream transport queues whatever `send_bytes` is given, without bound, and never
tells the sender that the client has fallen behind. A client that stopped reading an SSE
answer therefore made the gateway hold the rest of that answer in memory, however long.
The kernel still knows how far behind the client is: the bytes waiting in the connection's
send queue (SIOCOUTQ).

Once a stream has sent `WATCH_AFTER` bytes (a long answer), its connection's socket is
looked up among the worker's descriptors by its two addresses (`Sockets`, over
`llmgw.connections`; HTTP/1.1 only, where a connection carries one answer at a time). From then on, every `CHECK_EVERY` bytes,
the relay reads that queue. Past `limit` bytes it stops reading from the replica and waits
for the queue to shrink. If the client's side has taken no byte for `idle` seconds meanwhile
(TCP_INFO's `tcpi_bytes_acked` did not move: its receive window stayed shut), the stream
is ended: `ClientStalled`, and the relay cancels the engine's request and bills the tokens
produced.

What the gateway holds for a stalled client is then about `limit`, plus what the kernel
buffers, instead of the whole answer. HTTP/2 streams are not watched: their flow control
is per stream, inside one connection that other streams share.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
import time

from llmgw.connections import Ends, address, borrow, connections, ends, is_connection

WATCH_AFTER = 256 << 10
"""Bytes a stream sends before its socket is looked up: short answers never pay for it."""
BEHIND_LIMIT = 256 << 10
"""Bytes a client may leave unread in its connection's send queue before the stream waits."""
CHECK_EVERY = 16 << 10
"""Bytes sent between two reads of the socket's send queue."""
POLL = 0.05
"""Seconds between two reads of the queue while the relay waits for it to shrink."""
SCAN_EVERY = 1.0
"""Seconds between two scans of the worker's descriptors (a scan looks at every socket)."""
_SIOCOUTQ = termios.TIOCOUTQ
"""Linux: the ioctl that gives a TCP socket's unsent and unacknowledged bytes (SIOCOUTQ)."""
_BYTES_ACKED = 120
"""Offset of `tcpi_bytes_acked` (u64) in Linux's `struct tcp_info`: the bytes the peer's
kernel took. It stops moving when the client stops reading (its receive window closes)."""
_TCP_INFO_LEN = _BYTES_ACKED + 8


class ClientStalled(Exception):
    """The client read nothing of its answer for the idle timeout."""


class Sockets:
    """Which descriptor of this worker is the TCP connection with given ends.

    A scan looks at every socket descriptor; scans happen only when a watched stream's
    connection is not known yet, at most every `SCAN_EVERY` seconds.
    """

    def __init__(self) -> None:
        self._by_ends: dict[Ends, int] = {}
        self._scanned = -SCAN_EVERY

    def find(self, want: Ends) -> int | None:
        """The descriptor of connection `want`, or None (not found, or a scan was made too
        recently: ask again later)."""
        fd = self._by_ends.get(want)
        if fd is not None and is_connection(fd, want):
            return fd
        now = time.monotonic()
        if now - self._scanned < SCAN_EVERY:
            return None
        self._scanned = now
        self._by_ends = connections()
        return self._by_ends.get(want)


def queued(fd: int, want: Ends, limit: int) -> tuple[int, int] | None:
    """(bytes waiting in the send queue, bytes the client's side has acknowledged so far) of
    descriptor `fd`, when at least `limit` bytes wait (or half its send buffer, when that is
    less); None when fewer wait, or when `fd` is no longer connection `want`."""
    sock = borrow(fd)
    if sock is None:
        return None
    try:
        if ends(sock) != want:
            return None  # closed, and the number reused by another connection
        waiting = int(struct.unpack("i", fcntl.ioctl(fd, _SIOCOUTQ, b"\0\0\0\0"))[0])
        # The kernel grows a connection's send buffer as it needs (up to net.ipv4.tcp_wmem's
        # last figure): a queue can stop short of `limit` when its buffer is small.
        full = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2
        if waiting < min(limit, full):
            return None
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(info) < _TCP_INFO_LEN:
            return None  # a kernel without tcpi_bytes_acked (before Linux 4.2): not watched
        return waiting, int(struct.unpack_from("Q", info, _BYTES_ACKED)[0])
    except OSError:
        return None
    finally:
        sock.detach()


class Watch:
    """One streamed answer's view of its client's connection."""

    __slots__ = ("_ends", "_fd", "_next", "_sockets", "idle", "limit")

    def __init__(self, sockets: Sockets, server: str | None, client: str | None,
                 limit: int, idle: float) -> None:
        local, peer = address(server), address(client)
        self._ends = None if local is None or peer is None else (local, peer)
        self._sockets = sockets
        self._fd: int | None = None
        self.limit = limit
        self.idle = idle
        self._next = 0

    async def check(self, sent: int) -> None:
        """After `sent` bytes of the answer went to the transport: waits while the client is
        `limit` bytes behind (or half its socket's send buffer, when that is less), and raises
        ClientStalled once its side has taken nothing for `idle` seconds."""
        if sent < self._next:
            return
        self._next = sent + CHECK_EVERY
        want = self._ends
        if want is None:
            self._next = 1 << 62  # nothing to find its socket by: never watched
            return
        if self._fd is None:
            self._fd = self._sockets.find(want)
            if self._fd is None:
                return  # looked for again after CHECK_EVERY more bytes
        seen = queued(self._fd, want, self.limit)
        if seen is None:
            return
        acked, moved_at = seen[1], time.monotonic()
        while True:
            await asyncio.sleep(POLL)
            seen = queued(self._fd, want, self.limit)
            if seen is None:
                return
            now = time.monotonic()
            if seen[1] != acked:  # the client took more: it reads, however slowly
                acked, moved_at = seen[1], now
            elif now - moved_at >= self.idle:
                raise ClientStalled(f"the client read nothing of its streamed answer for {self.idle:g}s "
                                    f"with {seen[0]} bytes waiting for it")
