"""llmgw.net.connections: a connection found by its two addresses, as RSGI scopes give them."""

from __future__ import annotations

import select
import socket
import subprocess
import sys

from llmgw.net.connections import (
    Ends,
    TcpDiag,
    address,
    descriptors,
    listener_families,
    shutdown_silent,
)
from llmgw.net.silent import SilentSweep
from tests.support.procs import wait_for


def _pair(family: int = socket.AF_INET, host: str = "127.0.0.1") -> tuple[socket.socket, socket.socket]:
    srv = socket.socket(family)
    srv.bind((host, 0))
    srv.listen()
    client = socket.create_connection(("127.0.0.1", srv.getsockname()[1]))
    served, _ = srv.accept()
    srv.close()
    return client, served


def test_addresses_read_as_scopes_write_them() -> None:
    assert address("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert address("[::1]:8080") == ("::1", 8080)
    assert address("[::ffff:10.0.0.1]:9") == ("10.0.0.1", 9)
    assert address(None) is None and address("nowhere") is None and address("host:port") is None


def test_the_kernel_says_how_far_behind_a_peer_that_does_not_read_is() -> None:
    client, served = _pair()
    want = (served.getsockname(), served.getpeername())
    diag = TcpDiag()
    try:
        waiting, sndbuf, acked = diag.queue(want) or (None, None, None)
        assert (waiting, acked) == (0, 0) and sndbuf is not None and sndbuf > 0
        served.setblocking(False)
        sent = 0
        try:
            while True:
                sent += served.send(b"x" * 65536)
        except BlockingIOError:
            pass
        behind = diag.queue(want)
        assert behind is not None
        # What the client's side took (its receive buffer) and what waits add up to what was sent.
        assert behind[0] > 0 and behind[0] + behind[2] == sent
        client.recv(1 << 16)
        assert diag.queue(want)[2] > behind[2]  # type: ignore[index]
        # Another port is not this connection (an exact lookup that misses finds nothing,
        # not the listener); a closed connection is gone.
        assert diag.queue((want[0], (want[1][0], 1))) is None
        assert not diag.shutdown((want[0], (want[1][0], 1)))
        # Shut down by its addresses, its peer sees the end of what was queued.
        assert diag.shutdown(want)
        client.settimeout(5)
        while client.recv(1 << 20):
            pass
    finally:
        client.close()
        served.close()
    try:
        assert diag.queue(want) is None
    finally:
        diag.close()


def test_an_ipv4_client_of_a_dual_stack_listener_is_found_by_its_plain_addresses() -> None:
    client, served = _pair(socket.AF_INET6, "::")
    try:
        local, peer = served.getsockname()[:2], served.getpeername()[:2]
        assert local[0] == "::ffff:127.0.0.1"
        plain = (("127.0.0.1", local[1]), ("127.0.0.1", peer[1]))
        diag = TcpDiag()
        try:
            assert diag.queue(plain) is not None
            assert diag.shutdown(plain)
            client.settimeout(5)
            assert client.recv(1) == b""
        finally:
            diag.close()
    finally:
        client.close()
        served.close()


def _arrived(sock: socket.socket) -> bool:
    """Whether bytes wait to be read on `sock`."""
    return bool(select.select([sock], [], [], 0)[0])


def _served(family: int, host: str, n: int) -> tuple[socket.socket, list[socket.socket], list[socket.socket]]:
    """A listener on `host`, and `n` connections to it: (listener, clients, served ends)."""
    srv = socket.socket(family)
    srv.bind((host, 0))
    srv.listen(n)
    clients, served = [], []
    for _ in range(n):
        clients.append(socket.create_connection(("127.0.0.1", srv.getsockname()[1])))
        served.append(srv.accept()[0])
    return srv, clients, served


def test_a_listeners_address_says_which_families_its_connections_have() -> None:
    assert listener_families("0.0.0.0") == listener_families("127.0.0.1") == (socket.AF_INET,)
    assert listener_families("::") == listener_families("[::1]") == (socket.AF_INET6,)
    assert listener_families("localhost") == (socket.AF_INET, socket.AF_INET6)


def test_the_kernel_lists_a_listeners_connections_that_sent_nothing() -> None:
    srv, clients, served = _served(socket.AF_INET, "127.0.0.1", 40)
    other, o_clients, o_served = _served(socket.AF_INET, "127.0.0.1", 2)  # another port: never listed
    port = srv.getsockname()[1]
    diag = TcpDiag()
    try:
        for c in clients[:10]:
            c.sendall(b"G")
        ends = {(s.getsockname(), s.getpeername()) for s in served[10:]}

        def silent_ones() -> dict[int, Ends] | None:
            now = diag.silent(port)
            return now if set(now.values()) == ends else None

        silent = wait_for("the ten that spoke to leave the kernel's list", silent_ones)
        # Each is one of this process's descriptors, found by its inode; a shutdown ends it
        # for its peer, unless its first byte came meanwhile.
        fds = descriptors(set(silent))
        assert sorted(fds.values()) == sorted(s.fileno() for s in served[10:])
        by_fd = {fd: inode for inode, fd in fds.items()}
        quiet, late = served[10], served[11]
        clients[11].sendall(b"G")
        wait_for("the late one's first byte", lambda: _arrived(late))
        assert not shutdown_silent(late.fileno(), silent[by_fd[late.fileno()]])
        assert not shutdown_silent(quiet.fileno(), (silent[by_fd[quiet.fileno()]][0], ("127.0.0.1", 1)))
        assert shutdown_silent(quiet.fileno(), silent[by_fd[quiet.fileno()]])
        clients[10].settimeout(5)
        assert clients[10].recv(1) == b""
        assert len(diag.silent(port)) == 28
    finally:
        diag.close()
        for s in (srv, other, *clients, *served, *o_clients, *o_served):
            s.close()


def test_a_dual_stack_listeners_ipv4_clients_are_listed_with_plain_addresses() -> None:
    srv, clients, served = _served(socket.AF_INET6, "::", 2)
    diag = TcpDiag()
    try:
        port = srv.getsockname()[1]
        want = {(("127.0.0.1", port), ("127.0.0.1", c.getsockname()[1])) for c in clients}
        assert set(diag.silent(port).values()) == want
        assert set(diag.silent(port, listener_families("::")).values()) == want
        assert diag.silent(port, listener_families("0.0.0.0")) == {}
    finally:
        diag.close()
        for s in (srv, *clients, *served):
            s.close()


def test_the_sweep_closes_what_stayed_silent_for_the_deadline_and_nothing_else() -> None:
    srv, clients, served = _served(socket.AF_INET, "127.0.0.1", 6)
    closed: list[int] = []
    sweep = SilentSweep(srv.getsockname()[1], after=10, on_closed=closed.append)
    holder: subprocess.Popen[bytes] | None = None
    try:
        assert sweep.interval == 2.0
        assert sweep.sweep(100.0) == 0 and len(sweep.first_seen) == 6  # first seen now
        clients[0].sendall(b"G")
        wait_for("the first one's byte", lambda: _arrived(served[0]))
        assert sweep.sweep(105.0) == 0 and len(sweep.first_seen) == 5  # it spoke: forgotten
        # Another worker's (a descriptor only another process holds) is listed, left alone.
        elsewhere = served.pop(5)
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                  pass_fds=[elsewhere.fileno()])
        elsewhere.close()
        assert sweep.sweep(110.0) == 4 and closed == []  # `on_closed` is the thread's
        for c in clients[1:5]:
            c.settimeout(5)
            assert c.recv(1) == b""
        assert len(sweep.first_seen) == 1  # the one held elsewhere, still silent
        clients[5].setblocking(False)
        try:
            clients[5].recv(1)
            raise AssertionError("another process's connection was closed")
        except BlockingIOError:
            pass
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        sweep.stop()
        for s in (srv, *clients, *served):
            s.close()
