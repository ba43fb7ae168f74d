"""llmgw.connections: a connection found by its two addresses, as RSGI scopes give them."""

from __future__ import annotations

import socket

from llmgw.connections import TcpDiag, address


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
