"""A served connection's socket, found behind granian's back (Linux, /proc/self/fd).

RSGI gives an app its connection's two addresses (`scope.server`, `scope.client`) and no
handle on the socket. The socket is one of the worker's own descriptors, granian's, so it
can be found by those addresses and then looked at (the gateway's slow-reader watch) or
broken (the engine simulator's reset fault). It stays granian's: a socket object made
over it here is always `detach()`ed, never closed.
"""

from __future__ import annotations

import os
import socket

Address = tuple[str, int]
Ends = tuple[Address, Address]
"""(local, peer) of a TCP connection."""

FD_DIR = "/proc/self/fd"


def address(text: str | None) -> Address | None:
    """("ip", port) of an RSGI scope's `server` or `client` ("1.2.3.4:5" or "[::1]:5")."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return _plain(host.strip("[]")), int(port)


def _plain(ip: str) -> str:
    # A dual-stack listener reports IPv4 peers as IPv4-mapped IPv6 addresses.
    return ip.removeprefix("::ffff:")


def borrow(fd: int) -> socket.socket | None:
    """A socket object over descriptor `fd` (None when it is not a socket now): `detach()` it."""
    try:
        return socket.socket(fileno=fd)
    except OSError:
        return None


def ends(sock: socket.socket) -> Ends | None:
    """(local, peer) of a connected TCP socket; None for anything else."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return None
    try:
        local, peer = sock.getsockname(), sock.getpeername()
    except OSError:
        return None  # a listener, or closed meanwhile
    return (_plain(local[0]), local[1]), (_plain(peer[0]), peer[1])


def is_connection(fd: int, want: Ends) -> bool:
    """Whether descriptor `fd` is still the connection `want` (numbers are reused)."""
    sock = borrow(fd)
    if sock is None:
        return False
    try:
        return ends(sock) == want
    finally:
        sock.detach()


def connections(fd_dir: str = FD_DIR) -> dict[Ends, int]:
    """Every TCP connection among the worker's descriptors, by its ends: one look at each
    socket descriptor (a few microseconds each)."""
    found: dict[Ends, int] = {}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for name in names:
        try:
            if not os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                continue
        except OSError:  # the descriptor listdir itself used, or one closed meanwhile
            continue
        sock = borrow(int(name))
        if sock is None:
            continue
        try:
            if (e := ends(sock)) is not None:
                found[e] = int(name)
        finally:
            sock.detach()
    return found
