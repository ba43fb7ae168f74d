"""Connections that send nothing are closed at a listener's header deadline.

granian's header deadline (the gateway's `timeouts.client_headers`, the admin listener's
`admin_header_timeout`) starts at a connection's first byte. A client that connects and
sends nothing therefore holds a descriptor and one of the worker's places until it leaves.
granian serves a bounded number of connections at once (its backpressure: the gateway's
`max_connections`, 2,048 before that was a setting), and 2,100 silent connections from one
client stopped a gateway from answering anything, its health check included (measured). nginx's
`client_header_timeout` counts from the accept for this reason.

`SilentSweep` asks the kernel, every quarter of the deadline (at most 2 s), which of the
listener's connections have received no byte (`TcpDiag.silent`), and shuts down this
worker's that have stayed so for the deadline: such a connection has no request, so nothing
is cut short. Its client sees the connection end, as an idle keep-alive connection's does at
the same deadline. It runs on a thread of its own: a sweep reads one kernel message per
connection (about 2 µs each), which the event loop should not wait for. Linux only, like
`llmgw.net.connections`; elsewhere nothing is swept.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable

from llmgw.net.connections import Ends, TcpDiag, descriptors, listener_families, shutdown_silent

log = logging.getLogger("llmgw.net.silent")

MAX_INTERVAL = 2.0
"""Seconds between sweeps at most: a silent connection is closed within `after` + twice this."""
MIN_INTERVAL = 0.25


class SilentSweep:
    """Closes this worker's connections to `port` that have sent nothing for `after` seconds."""

    def __init__(self, port: int, after: float, on_closed: Callable[[int], None] = lambda n: None,
                 families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6), diag: TcpDiag | None = None) -> None:
        self.port = port
        self.families = families
        """Of the listener's connections (`connections.listener_families`): each is a walk of
        the kernel's table, about a millisecond."""
        self.after = after
        self.interval = min(max(after / 4, MIN_INTERVAL), MAX_INTERVAL)
        self.on_closed = on_closed
        self.diag = diag or TcpDiag()
        self.first_seen: dict[int, float] = {}
        """Socket inode -> when a sweep first saw it silent; a connection is closed once it
        has stayed silent for `after` by this (kernels do not say since when)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def serving(cls, host: str, port: int, after: float,
                on_closed: Callable[[int], None]) -> SilentSweep | None:
        """A started sweep of the listener on `host`:`port`, or None where there is nothing to
        sweep: not Linux, or no fixed port."""
        if sys.platform != "linux" or not port:
            return None
        sweep = cls(port, after, on_closed, listener_families(host))
        sweep.start()
        return sweep

    def sweep(self, now: float) -> int:
        """One pass; returns the connections closed. Silent connections of other workers
        (listed too: they share the port) are left to theirs."""
        silent = self.diag.silent(self.port, self.families)
        seen = self.first_seen
        for inode in [i for i in seen if i not in silent]:
            del seen[inode]  # sent something, or gone
        due: dict[int, Ends] = {}
        for inode, ends in silent.items():
            since = seen.setdefault(inode, now)
            if now - since >= self.after:
                due[inode] = ends
        if not due:
            return 0
        closed = 0
        for inode, fd in descriptors(set(due)).items():
            if shutdown_silent(fd, due[inode]):
                closed += 1
                del seen[inode]
        return closed

    def start(self) -> None:
        """Sweeps on a daemon thread until `stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmgw-silent-sweep", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                closed = self.sweep(time.monotonic())
            except Exception:
                log.exception("the sweep for connections that send nothing failed; trying again in %gs",
                              self.interval)
                continue
            if closed:
                log.warning("closed %d connection%s that sent nothing within %gs of connecting "
                            "(timeouts.client_headers)", closed, "" if closed == 1 else "s", self.after)
                self.on_closed(closed)

    def stop(self) -> None:
        """Ends the thread (within one interval) and closes the netlink socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 1)
            self._thread = None
        self.diag.close()
