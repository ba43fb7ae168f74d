"""The ready line every llmgw server prints (llmgw.net.serving)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from llmgw.net.serving import YOUNG_COLLECTION_EVERY, announce_when_listening


def test_the_ready_line_waits_for_an_answer_not_for_the_port(capfd: pytest.CaptureFixture[str]) -> None:
    # The port accepts (the kernel queues the connection) but nothing answers yet: granian's
    # worker is still in the app's start hook.
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        announce_when_listening("127.0.0.1", port, "app is ready", timeout=20)
        time.sleep(1.0)
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
