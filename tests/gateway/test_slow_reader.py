"""Slow readers: a client that stops reading its streamed answer is not sent the
rest into the gateway's memory; after `timeouts.client_idle` without reading, the engine's
request is cancelled and the tokens produced are billed. A client that reads slowly, but
reads, gets its whole answer."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from bench.procs import group_pids, rss_bytes

from tests.support.gateway import Gateway, http_get, metric_value, start_sim

TOKENS = 300_000
"""About 60 MB of SSE: what the gateway would come to hold for a client that reads nothing."""


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of the process group `pid` leads (the gateway and granian's worker), in MB."""
    return rss_bytes(group_pids(pid)) / (1 << 20)


def _request(gw: Gateway, tokens: int, rcvbuf: int) -> socket.socket:
    """A raw HTTP/1.1 streamed chat request with a small receive buffer; nothing read yet."""
    u = urlsplit(gw.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((u.hostname, u.port))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": tokens}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _aborted(sim_url: str) -> float:
    return metric_value(http_get(sim_url + "/metrics"), "llmgw_sim_requests_aborted_total")


def test_a_client_that_stops_reading_is_cut_and_its_engine_request_cancelled(
        gateway_factory: Callable[..., Gateway]) -> None:
    # About 500 tokens a second, minutes for the whole answer: the simulator, served by
    # granian as well, queues what it writes without bound too, and at full speed (shorter
    # sleeps round to none) it would have written the whole answer, and finished, leaving no
    # request to cancel, before the idle timeout.
    with start_sim("--model", "m", "--output-tokens", str(TOKENS), "--itl-ms", "2") as sim:
        gw = gateway_factory([f"r1={sim.url}=m"], {"timeouts": {"client_idle": 2}})
        before = _tree_rss_mb(gw.proc.popen.pid)
        sock = _request(gw, TOKENS, 16 << 10)
        try:
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # and then nothing more is read
            t0 = time.monotonic()
            while _aborted(sim.url) < 1:
                assert time.monotonic() - t0 < 30, (
                    f"the engine's request was never cancelled:\n{gw.proc.output[-2000:]}")
                time.sleep(0.2)
            waited = time.monotonic() - t0
            grew = _tree_rss_mb(gw.proc.popen.pid) - before
            # Its connection was shut down: what was queued for it, then the end, without
            # the last chunk of a finished answer.
            sock.settimeout(10)
            rest = b""
            while chunk := sock.recv(1 << 20):
                rest += chunk
            assert rest and not rest.endswith(b"0\r\n\r\n")
        finally:
            sock.close()
        rec = gw.usage(1)[0]
        print(f"cancelled {waited:.1f} s after the client stopped reading; the gateway grew {grew:.1f} MB; "
              f"{rec['completion_tokens']} tokens billed")
        # The client stopped at once; the gateway waited `client_idle` once it was far behind.
        assert 2 <= waited < 20
        assert rec["status"] == "client_timeout"
        # What the gateway took from the engine: about the 256 KiB it let wait for the client
        # (some 200 bytes a token), not the answer.
        assert 0 < rec["completion_tokens"] < 5_000
        # Before: the whole answer (~60 MB here) waited in the gateway for the client.
        assert grew < 20, f"the gateway grew {grew:.1f} MB for a client that reads nothing"
        assert gw.metric("llmgw_replica_in_flight", replica="r1") == 0
        assert gw.metric("llmgw_client_connections_closed_total", reason="stalled") == 1


def test_a_client_that_reads_slowly_gets_its_whole_answer(gateway_factory: Callable[..., Gateway]) -> None:
    tokens = 6_000  # about 1.2 MB: well past the point where streams are watched
    with start_sim("--model", "m", "--output-tokens", str(tokens)) as sim:
        gw = gateway_factory([f"r1={sim.url}=m"], {"timeouts": {"client_idle": 1}})
        sock = _request(gw, tokens, 16 << 10)
        data = b""
        try:
            sock.settimeout(10)
            # 32 KiB every 50 ms: slower than the engine writes, so the stream has to wait for
            # the client, but never a second without reading.
            while not (b"data: [DONE]" in data[-64:] and data.endswith(b"\r\n0\r\n\r\n")):
                chunk = sock.recv(32 << 10)
                assert chunk, f"the gateway closed the answer early, after {len(data)} bytes"
                data += chunk
                time.sleep(0.05)
        finally:
            sock.close()
        rec = gw.usage(1)[0]
        assert rec["status"] == "ok" and rec["completion_tokens"] == tokens
        assert _aborted(sim.url) == 0


def test_waiting_for_a_slow_client_ends_at_the_requests_deadline(gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m", "--output-tokens", str(TOKENS), "--itl-ms", "2") as sim:
        gw = gateway_factory([f"r1={sim.url}=m"], {"timeouts": {"client_idle": 30, "total": 6}})
        sock = _request(gw, TOKENS, 16 << 10)
        t0 = time.monotonic()
        try:
            sock.settimeout(10)
            # 1 KiB every 0.2 s: it reads, so it is never idle, and the stream waits for it
            # past 256 KiB behind; the request's own deadline still ends it.
            while time.monotonic() - t0 < 25 and sock.recv(1024):
                time.sleep(0.2)
        finally:
            sock.close()
        rec = gw.usage(1)[0]
        assert rec["status"] == "timeout", rec
        assert 6 <= rec["duration_ms"] / 1000 < 12
        assert _aborted(sim.url) == 1
