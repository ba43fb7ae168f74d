"""A served connection, seen behind granian's back (Linux).

RSGI gives an app its connection's two addresses (`scope.server`, `scope.client`) and no
handle on the socket. By those addresses the kernel can still be asked about the
connection (`TcpDiag`, over NETLINK_SOCK_DIAG as `ss` does: its send queue and how much
the peer took, for the gateway's slow-reader watch), and the socket, one of the worker's
own descriptors, shut down (`TcpDiag.shutdown`: a cut slow reader, the engine simulator's
reset fault). The socket stays granian's: a socket object made over it here is always
`detach()`ed, never closed.

The same netlink socket lists a listener's connections that have not sent a byte yet
(`TcpDiag.silent`), which granian's header deadline never ends (it starts at the first
byte); `shutdown_silent` ends one of this worker's (`llmgw/net/silent.py`).
"""

from __future__ import annotations

import os
import socket
import struct

from llmgw import _core

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


def descriptors(inodes: set[int], fd_dir: str = FD_DIR) -> dict[int, int]:
    """Socket inode -> this process's descriptor of it, for those of `inodes` it holds: a
    readlink a descriptor, once for all of them."""
    found: dict[int, int] = {}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:  # the descriptor listdir itself used, or one closed meanwhile
            continue
        if target.startswith("socket:["):
            inode = int(target[8:-1])
            if inode in inodes:
                found[inode] = int(name)
                if len(found) == len(inodes):
                    break
    return found


def shutdown_silent(fd: int, want: Ends) -> bool:
    """Shuts down this process's descriptor `fd` if it is still the connection `want` and its
    peer has still sent no byte (asked of the socket itself, now); False otherwise."""
    return _shut(fd, want, only_silent=True)


def _shut(fd: int | None, want: Ends, only_silent: bool = False) -> bool:
    """Shuts descriptor `fd` down, both ways, if it is the connection `want` (and, with
    `only_silent`, its peer has sent nothing); False otherwise. granian's socket: detached."""
    sock = None if fd is None else borrow(fd)
    if sock is None:
        return False
    try:
        if ends(sock) != want:
            return False  # closed, and its number taken by another connection meanwhile
        if only_silent:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
            if len(info) < _BYTES_RECEIVED + 8 or struct.unpack_from("=Q", info, _BYTES_RECEIVED)[0] != 0:
                return False  # its first byte came since it was listed
        sock.shutdown(socket.SHUT_RDWR)  # acts on the socket itself, granian's too
        return True
    except OSError:
        return False
    finally:
        sock.detach()


def listener_families(host: str) -> tuple[int, ...]:
    """The address families a listener on `host` has connections of: IPv4 for an IPv4 address
    (or none), IPv6 for an IPv6 one (a dual-stack listener's IPv4 peers are IPv6 connections
    with mapped addresses), both for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host.strip("[]"))
            return (family,)
        except OSError:
            continue
    return (socket.AF_INET,) if not host else (socket.AF_INET, socket.AF_INET6)


class TcpDiag:
    """Questions about TCP connections of this network namespace over NETLINK_SOCK_DIAG (what
    `ss` uses; no privilege needed): one connection by its ends (one request, no descriptor),
    or a listener's silent ones (one dump)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0

    def queue(self, want: Ends) -> tuple[int, int, int] | None:
        """(bytes in its send queue, its send buffer, bytes its peer has taken so far) of the
        established connection `want`; None when there is none (or the kernel cannot say)."""
        seen = self._seen(want)
        return None if seen is None else seen[:3]

    def shutdown(self, want: Ends) -> bool:
        """Shuts the established connection `want` down, both ways: its peer sees it end, and
        granian drops it and what it still held for it. False when it was not found."""
        seen = self._seen(want)
        return seen is not None and _shut(descriptors({seen[3]}).get(seen[3]), want)

    def _seen(self, want: Ends) -> tuple[int, int, int, int] | None:
        local, peer = want
        if ":" in local[0]:
            return self._ask(socket.AF_INET6, want)
        # An IPv4 client of a dual-stack listener is an IPv6 connection with mapped addresses.
        return self._ask(socket.AF_INET, want) or self._ask(
            socket.AF_INET6, (("::ffff:" + local[0], local[1]), ("::ffff:" + peer[0], peer[1])))

    def silent(self, port: int, families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6)) -> dict[int, Ends]:
        """The established connections to local `port` whose peer has sent no byte yet: socket
        inode -> (local, peer). Every process's, of `families`; {} when the kernel cannot say.
        The kernel picks the port's connections (a filter program), so the cost follows the
        listener's connections, plus about a millisecond a family to walk its table."""
        found: dict[int, Ends] = {}
        for family in families:
            self._dump(family, port, found)
        return found

    def _dump(self, family: int, port: int, found: dict[int, Ends]) -> None:
        sock = self._socket()
        if sock is None:
            return
        # inet_diag_req_v2 with no socket id (a dump), then the filter as its one attribute:
        # source port >= port, then <= port (INET_DIAG_BC_S_GE and _S_LE, each followed by
        # an op holding the port; a failed test jumps past the end, which rejects).
        program = (struct.pack("=BBH", _BC_S_GE, 8, 20) + struct.pack("=BBH", 0, 0, port)
                   + struct.pack("=BBH", _BC_S_LE, 8, 12) + struct.pack("=BBH", 0, 0, port))
        req = (struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INFO - 1), 0, _ESTABLISHED)
               + bytes(48) + struct.pack("=HH", 4 + len(program), _REQ_BYTECODE) + program)
        self._seq += 1
        seq = self._seq
        try:
            sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP,
                                  seq, 0) + req)
            while True:
                # A dump is written as it is read: each recv hands over the next part at once.
                data = sock.recv(65536)
                if not data:
                    return
                part, more = _core.silent_connections(data, seq, port)
                found.update(part)
                if not more:
                    return
        except OSError:  # BlockingIOError included: the kernel said all it will
            return

    def _socket(self) -> socket.socket | None:
        if self._sock is None:
            try:
                self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
            except OSError:
                return None
            # The kernel answers within the send (a dump within each recv), so the answer is
            # there to read at once: never wait for it (a watch runs on the event loop).
            self._sock.setblocking(False)
        return self._sock

    def close(self) -> None:
        """Closes its netlink socket (a later question opens another)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _ask(self, family: int, want: Ends) -> tuple[int, int, int, int] | None:
        (lip, lport), (pip, pport) = want
        sock = self._socket()
        if sock is None:
            return None
        try:
            ips = socket.inet_pton(family, lip).ljust(16, b"\0") + socket.inet_pton(family, pip).ljust(16, b"\0")
        except OSError:
            return None
        # struct inet_diag_req_v2, then its inet_diag_sockid (ports and addresses big-endian;
        # no cookie: an exact lookup by the four values).
        req = (struct.pack("=BBBBI", family, socket.IPPROTO_TCP, _WANT, 0, _ESTABLISHED)
               + struct.pack("!HH", lport, pport) + ips + struct.pack("=III", 0, _NOCOOKIE, _NOCOOKIE))
        self._seq += 1
        try:
            sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                                  self._seq, 0) + req)
            data = sock.recv(8192)
        except OSError:
            return None
        return _answer(data, self._seq, lport, pport)


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_REQ_BYTECODE = 1
"""The request's attribute holding a filter program (INET_DIAG_REQ_BYTECODE)."""
_BC_S_GE, _BC_S_LE = 2, 3
"""Filter ops: source (local) port at least, at most (INET_DIAG_BC_S_GE, _S_LE)."""
_NOCOOKIE = 0xFFFFFFFF
_ESTABLISHED = 1 << 1
"""idiag_states: TCP_ESTABLISHED only (an exact lookup that misses may find the listener)."""
_INFO, _SKMEMINFO = 2, 7
"""The attributes asked for: struct tcp_info, and the socket's memory figures."""
_WANT = (1 << (_INFO - 1)) | (1 << (_SKMEMINFO - 1))
_BYTES_ACKED = 120
"""Offset of `tcpi_bytes_acked` (u64) in struct tcp_info (Linux 4.2 on)."""
_BYTES_RECEIVED = 128
"""Offset of `tcpi_bytes_received` (u64) in struct tcp_info (Linux 4.1 on)."""
_INFO_SIZE = 232
"""Bytes of struct tcp_info asked of a socket: what `_BYTES_RECEIVED` needs, and more."""
_SNDBUF = 3
"""Index of SK_MEMINFO_SNDBUF among the memory figures (u32 each)."""


def _answer(data: bytes, seq: int, lport: int, pport: int) -> tuple[int, int, int, int] | None:
    """(send queue, send buffer, bytes acked, inode) from a SOCK_DIAG answer: nlmsghdr (16
    bytes: length, type, flags, sequence), struct inet_diag_msg (72: family, state, timer,
    retrans, the sockid from 4, the queues at 56 and 60, the inode at 68), then its
    attributes."""
    if len(data) < 16 + 72:
        return None  # an error (not found), or nothing
    length, kind, _, got = struct.unpack_from("=IHHI", data, 0)
    state = data[17]
    sport, dport = struct.unpack_from("!HH", data, 20)
    if kind == _NLMSG_ERROR or got != seq or state != 1 or (sport, dport) != (lport, pport):
        return None  # not this question's answer, or not this established connection
    (waiting,) = struct.unpack_from("=I", data, 16 + 60)
    (inode,) = struct.unpack_from("=I", data, 16 + 68)
    acked = sndbuf = None
    at, end = 16 + 72, min(length, len(data))
    while at + 4 <= end:
        size, attr = struct.unpack_from("=HH", data, at)
        if size < 4:
            break
        if attr == _INFO and size - 4 >= _BYTES_ACKED + 8:
            (acked,) = struct.unpack_from("=Q", data, at + 4 + _BYTES_ACKED)
        elif attr == _SKMEMINFO and size - 4 >= 4 * (_SNDBUF + 1):
            (sndbuf,) = struct.unpack_from("=I", data, at + 4 + 4 * _SNDBUF)
        at += (size + 3) & ~3
    if acked is None or sndbuf is None:
        return None
    return waiting, sndbuf, acked, inode
