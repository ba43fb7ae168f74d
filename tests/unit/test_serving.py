"""The ready line every llmgw server prints (llmgw.serving)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from llmgw.serving import announce_when_listening


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
