"""What every llmgw server shares (llmgw.net.serving): its ready line, port 0, its heap."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from llmgw.net import serving
from llmgw.net.serving import YOUNG_COLLECTION_EVERY, announce_when_listening, bind_port


def test_the_ready_line_waits_for_an_answer_not_for_the_port(capfd: pytest.CaptureFixture[str]) -> None:
    # The port accepts (the kernel queues the connection) but nothing answers yet: granian's
    # worker is still in the app's start hook.
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        announce_when_listening("127.0.0.1", port, "app is ready", timeout=20)
        time.sleep(1.0)  # time for a wrong line to come: the point is that none does
        assert "app is ready" not in capfd.readouterr().out

        def answer() -> None:  # the app started: it answers the probe waiting in the queue
            conn, _ = srv.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        deadline = time.monotonic() + 10
        out = ""
        while "app is ready" not in out and time.monotonic() < deadline:
            time.sleep(0.05)
            out += capfd.readouterr().out
        assert out == "app is ready\n"


def test_port_0_is_one_port_held_by_the_process_that_its_listeners_join() -> None:
    assert bind_port("127.0.0.1", 8080) == 8080  # a port given is used as it is
    port = bind_port("127.0.0.1", 0)
    assert port != 0
    with socket.socket() as other, pytest.raises(OSError):  # held: no other process takes it
        other.bind(("127.0.0.1", port))
    # granian's listeners (SO_REUSEPORT, one per worker on Linux) bind it beside the held
    # socket, and every connection reaches them: the held socket never listens.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = listener.accept()
                conn.close()
    serving._HELD.pop().close()  # a server holds it until it exits; this test process goes on


def test_a_gateway_worker_freezes_its_startup_heap_and_collects_young_objects_less_often() -> None:
    # In a fresh interpreter, as granian's worker calls the factory: the test process's own
    # collector must stay as it is (its fixtures report leaks with gc.collect()).
    code = ("import gc; from llmgw.gateway.app import create_app; before = gc.get_threshold(); "
            "create_app(); print(before[0], gc.get_threshold()[0], gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         timeout=60).stdout.split()
    default, young, frozen = map(int, out)
    assert default == 700 and young == YOUNG_COLLECTION_EVERY
    assert frozen > 10_000  # the imported modules' objects, at least
