"""Replica and client faults, with real processes started and killed.

Each test asserts both what the client saw and what the gateway recorded.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import openai
import pytest
from bench.procs import group_pids

from tests.support.gateway import Gateway, http_get, metric_value, start_sim
from tests.support.procs import Proc, wait_for

MSG = [{"role": "user", "content": "write a long story"}]


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)


def test_replica_killed_mid_stream(gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m", "--itl-ms", "50", "--output-tokens", "200") as sim:
        gw = gateway_factory([f"r1={sim.url}=m"])
        stream = client(gw).chat.completions.create(model="m", messages=MSG, stream=True)
        seen = []
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                seen.append(chunk)
                if len(seen) == 4:
                    sim.kill()
        assert "incomplete" in str(err.value)
        assert not any(c.choices and c.choices[0].finish_reason == "stop" for c in seen)
    rec = gw.usage(1)[0]
    assert rec["status"] == "upstream_error" and rec["usage_estimated"] is True
    assert rec["completion_tokens"] >= 3 and rec["finish_reason"] is None


def test_replica_hangs_mid_stream(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"timeouts": {"idle": 0.5}})
    stream = client(gw).chat.completions.create(
        model="sim-model", messages=MSG, stream=True, extra_headers={"x-sim-fault": "hang-after=3"}
    )
    texts = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            texts.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert "silent" in str(err.value)
    assert len([t for t in texts if t]) == 3
    rec = gw.usage(1)[0]
    assert (
        rec["status"] == "timeout"
        and rec["completion_tokens"] == 3
        and rec["usage_estimated"] is True
    )


def test_replica_resets_mid_stream(gateway: Gateway) -> None:
    stream = client(gateway).chat.completions.create(
        model="sim-model", messages=MSG, stream=True, extra_headers={"x-sim-fault": "reset-after=2"}
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    rec = gateway.usage(1)[0]
    assert rec["status"] == "upstream_error" and rec["completion_tokens"] == 2


@pytest.mark.parametrize("fault", ["reset-after=2", "hang-after=2"])
def test_a_stream_broken_mid_answer_ends_right_after_its_error_event(
        gateway_factory: Callable[..., Gateway], sim: Proc, fault: str) -> None:
    """The client must see the end of the answer, not only the error event: a client that
    reads to the end (curl, urllib, any proxy in between) would otherwise hang."""
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"timeouts": {"idle": 0.5}})
    u = urlsplit(gw.base_url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "sim-model", "messages": MSG, "stream": True, "max_tokens": 20}),
        {"content-type": "application/json", "x-sim-fault": fault})
    t0 = time.monotonic()
    body = conn.getresponse().read()  # raises TimeoutError when the answer never ends
    conn.close()
    assert time.monotonic() - t0 < 3
    events = [e for e in body.decode().split("\n\n") if e.strip()]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] in ("upstream_failed", "upstream_timeout")


def test_error_event_from_the_engine_is_relayed_as_an_error(gateway: Gateway) -> None:
    stream = client(gateway).chat.completions.create(
        model="sim-model", messages=MSG, stream=True, extra_headers={"x-sim-fault": "error-after=2"}
    )
    with pytest.raises(openai.APIError) as err:
        for _ in stream:
            pass
    assert "simulated engine error" in str(err.value)
    assert gateway.usage(1)[0]["status"] == "upstream_error"


def test_client_disconnect_mid_stream_cancels_upstream(
    gateway_factory: Callable[..., Gateway],
) -> None:
    with start_sim("--model", "m", "--itl-ms", "50", "--output-tokens", "500") as sim:
        gw = gateway_factory([f"r1={sim.url}=m"])
        stream = client(gw).chat.completions.create(model="m", messages=MSG, stream=True)
        for n, _ in enumerate(stream):
            if n == 3:
                break
        stream.close()
        t0 = time.monotonic()
        wait_for(
            "the simulator to see the request aborted",
            lambda: (
                metric_value(http_get(sim.url + "/metrics"), "llmgw_sim_requests_aborted_total")
                == 1
            ),
            5, every=0.05,
        )
        assert time.monotonic() - t0 < 1.0, (
            "the upstream request outlived the client by over a second"
        )
        assert metric_value(http_get(sim.url + "/metrics"), "vllm:num_requests_running") == 0
        rec = gw.usage(1)[0]
        assert rec["status"] == "cancelled" and rec["completion_tokens"] >= 3
        assert gw.metric("llmgw_replica_in_flight", replica="r1") == 0


def test_client_disconnect_while_waiting_cancels_upstream(gateway: Gateway, sim: Proc) -> None:
    u = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=0.5)
    body = json.dumps({"model": "sim-model", "messages": MSG})
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"content-type": "application/json", "x-sim-fault": "hang"},
    )
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()
    wait_for(
        "the simulator to see the request aborted",
        lambda: (
            metric_value(http_get(sim.url + "/metrics"), "llmgw_sim_requests_aborted_total") == 1
        ),
        5, every=0.05,
    )
    rec = gateway.usage(1)[0]
    assert rec["status"] == "cancelled" and rec["http_status"] == 499


def test_retry_on_another_replica_before_the_first_byte(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    # Probes are slow here, so the gateway learns of the dead replica only by
    # failing to connect to it with a request in hand.
    with start_sim("--model", "sim-model") as doomed:
        gw = gateway_factory([f"doomed={doomed.url}=sim-model", f"live={sim.url}=sim-model"],
                             {"health": {"probe_interval": 60}})
        assert gw.metric("llmgw_replica_healthy", replica="doomed") == 1
        c = client(gw)
        # Served once by each replica first (ties rotate): by then the first health probe,
        # sent at start, has been answered too. Killed before it was, the replica failed
        # that probe and no request ever tried it (1 run in 10 on a loaded machine).
        for _ in range(2):
            c.chat.completions.create(model="sim-model", messages=MSG, max_tokens=2)
        assert {r["replica"] for r in gw.usage(2)} == {"doomed", "live"}
        doomed.kill()
        for _ in range(4):
            r = c.chat.completions.create(model="sim-model", messages=MSG, max_tokens=2)
            assert r.choices[0].message.content
    recs = gw.usage(6)[2:]
    assert {r["replica"] for r in recs} == {"live"} and all(r["status"] == "ok" for r in recs)
    assert sum(r["retries"] for r in recs) == 1
    assert gw.metric("llmgw_upstream_retries_total", model="sim-model") == 1
    assert gw.metric("llmgw_replica_ejections_total", replica="doomed") == 1
    assert gw.metric("llmgw_replica_healthy", replica="doomed") == 0


def test_active_probes_follow_replica_health(gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m") as a, start_sim("--model", "m") as b:
        gw = gateway_factory(
            [f"a={a.url}=m", f"b={b.url}=m"],
            {"health": {"probe_interval": 0.2, "probe_timeout": 0.5}},
        )
        assert json.loads(http_get(gw.url + "/ready"))["healthy_replicas"] == 2
        a.kill()
        wait_for("replica a marked unhealthy",
                 lambda: gw.metric("llmgw_replica_healthy", replica="a") == 0, 5, every=0.05)
        r = client(gw).chat.completions.create(model="m", messages=MSG, max_tokens=1)
        assert r.choices
        b.kill()
        wait_for("replica b marked unhealthy",
                 lambda: gw.metric("llmgw_replica_healthy", replica="b") == 0, 5, every=0.05)
        u = urlsplit(gw.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        conn.request("GET", "/ready")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 503 and resp.getheader("retry-after") == "1"


def test_slowloris_is_cut_at_the_header_deadline(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    import socket

    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"timeouts": {"client_headers": 1}})
    u = urlsplit(gw.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        got = b""
        try:
            while chunk := s.recv(4096):  # the gateway answers 408 or just closes
                got += chunk
        except ConnectionResetError:
            pass
        waited = time.monotonic() - t0
    assert 0.5 < waited < 5, f"connection held for {waited:.1f}s"
    assert got == b"" or got.startswith(b"HTTP/1.1 408")
    # Other clients were served all along.
    assert client(gw).models.list().data


def _open_files(pid: int) -> int:
    return sum(len(os.listdir(f"/proc/{p}/fd")) for p in group_pids(pid))


def test_connections_that_send_nothing_are_closed_at_the_header_deadline(
        gateway_factory: Callable[..., Gateway]) -> None:
    # granian's header deadline starts at the first byte, and it serves `max_connections` at
    # once: a client that opened more and sent nothing kept the gateway from answering
    # anyone, its health check included, for as long as it liked.
    import socket
    import threading

    with start_sim("--model", "sim-model", "--ttft-ms", "2500") as slow:
        gw = gateway_factory([f"r1={slow.url}=sim-model"],
                             {"timeouts": {"client_headers": 1}, "max_connections": 200})
        u = urlsplit(gw.url)
        assert u.hostname is not None and u.port is not None
        http_get(gw.url + "/health")
        before = _open_files(gw.proc.popen.pid)
        # A request whose answer is 2.5 s away: connected and silent since it was sent, past
        # the deadline, and never cut.
        answers: list[str | None] = []
        waiting = threading.Thread(target=lambda: answers.append(client(gw).chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content))
        waiting.start()
        time.sleep(0.3)
        flood = [socket.create_connection((u.hostname, u.port), timeout=10) for _ in range(250)]
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request("GET", "/health")
        status = conn.getresponse().status
        answered = time.monotonic() - t0
        conn.close()
        assert status == 200 and answered < 6, f"health answered {status} after {answered:.1f}s"
        ended = 0
        for s in flood:
            s.settimeout(max(t0 + 8 - time.monotonic(), 0.1))
            try:
                ended += s.recv(1) == b""
            except ConnectionResetError:
                ended += 1
            except TimeoutError:
                pass
            s.close()
        assert ended == len(flood), f"{len(flood) - ended} silent connections still open 8 s on"
        waiting.join(10)
        assert answers and answers[0], "the request waiting for its answer was cut"
        assert gw.metric("llmgw_client_connections_closed_total", reason="silent") == len(flood)
        deadline = time.monotonic() + 5
        while (now := _open_files(gw.proc.popen.pid)) > before + 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert now <= before + 5, f"{now - before} more descriptors than before the flood"


def test_max_connections_bounds_the_connections_served_at_once(gateway_factory: Callable[..., Gateway]) -> None:
    import socket

    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with start_sim("--model", "sim-model", "--ttft-ms", "1500") as slow:
        gw = gateway_factory([f"r1={slow.url}=sim-model"], {"max_connections": 4})
        u = urlsplit(gw.url)
        assert u.hostname is not None and u.port is not None
        # Four requests 1.5 s from their answers fill the places: a fifth connection waits in
        # the kernel's queue until one of them ends.
        busy = [socket.create_connection((u.hostname, u.port), timeout=10) for _ in range(4)]
        for s in busy:
            s.sendall(request)
        time.sleep(0.3)  # for the four to be taken in; asking the gateway would take a place
        t0 = time.monotonic()
        assert http_get(gw.url + "/health")
        waited = time.monotonic() - t0
        for s in busy:
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            s.close()
            assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert 0.8 < waited < 5, f"the fifth connection was served after {waited:.2f}s"
        t0 = time.monotonic()
        assert http_get(gw.url + "/health")
        assert time.monotonic() - t0 < 0.5  # places free again


@pytest.mark.parametrize("framing", [b"Content-Length: 100\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_slow_body_upload_is_408_at_the_body_deadline(
        gateway_factory: Callable[..., Gateway], sim: Proc, framing: bytes) -> None:
    import socket
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"timeouts": {"client_body": 1}})
    u = urlsplit(gw.url)
    part = b'{"model"' if framing.startswith(b"Content") else b'8\r\n{"model"\r\n'
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + framing + b"\r\n" + part)
        t0 = time.monotonic()
        got = s.recv(4096)
        waited = time.monotonic() - t0
    assert 0.5 < waited < 5, f"an unfinished body held the request for {waited:.1f}s"
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b'"code":"request_timeout"' in got
    assert client(gw).models.list().data
