"""Fault injection via `x-sim-fault`, and client disconnects."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest

from tests.support.procs import Proc, wait_for
from tests.support.sim import StartSim, client_for, metric

MSGS: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
ABORTED = "llmgw_sim_requests_aborted_total"
RUNNING = "vllm:num_requests_running"


def fault(value: str) -> dict[str, str]:
    return {"x-sim-fault": value}


def open_request(proc: Proc, path: str, body: object, headers: dict[str, str]) -> socket.socket:
    """Send one HTTP/1.1 request on a raw socket and return the socket unread."""
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{head}\r\n".encode()
        + data
    )
    return sock


def read_until_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    with sock:
        while chunk := sock.recv(65536):
            out += chunk
    return out


def read_until(sock: socket.socket, marker: bytes, count: int) -> bytes:
    """Read until `marker` occurred `count` times."""
    out = b""
    while out.count(marker) < count:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed early: {out!r}"
        out += chunk
    return out


def stream_body(max_tokens: int = 8) -> dict[str, object]:
    return {"model": "sim-model", "messages": MSGS, "stream": True, "max_tokens": max_tokens}


def test_fail_codes(sim: Proc) -> None:
    with client_for(sim) as client:
        with pytest.raises(openai.InternalServerError) as e500:
            client.chat.completions.create(
                model="sim-model", messages=MSGS, extra_headers=fault("fail")
            )
        with pytest.raises(openai.APIStatusError) as e503:
            client.completions.create(
                model="sim-model", prompt="x", extra_headers=fault("fail=503")
            )
        with pytest.raises(openai.RateLimitError):
            client.embeddings.create(model="sim-model", input="x", extra_headers=fault("fail=429"))
    assert e500.value.status_code == 500
    assert e503.value.status_code == 503
    assert isinstance(e503.value.body, dict) and "simulated failure" in e503.value.body["message"]


def test_unknown_fault_is_400_listing_values(sim: Proc) -> None:
    with client_for(sim) as client, pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="sim-model", messages=MSGS, extra_headers=fault("explode")
        )
    assert "explode" in str(info.value)
    for name in ("fail=CODE", "hang-after=N", "reset-after=N", "slow=MS", "error-after=N"):
        assert name in str(info.value)


def test_error_after_is_200_with_data_error(sim: Proc) -> None:
    raw = read_until_eof(open_request(sim, "/v1/chat/completions", stream_body(),
                                      {**fault("error-after=3"), "connection": "close"}))  # fmt: skip
    assert raw.startswith(b"HTTP/1.1 200")
    assert raw.endswith(b"0\r\n\r\n")  # a clean end of the chunked body
    events = [line for line in raw.split(b"\r\n") if line.startswith(b"data: ")]
    assert len(events) == 1 + 3 + 2  # role, 3 tokens, error, [DONE]
    assert json.loads(events[4][6:])["error"]["message"] == "simulated engine error"
    assert events[5].strip() == b"data: [DONE]"
    got: list[str] = []
    with client_for(sim) as client, pytest.raises(openai.APIError, match="simulated engine error"):
        for chunk in client.chat.completions.create(
            model="sim-model", messages=MSGS, stream=True, extra_headers=fault("error-after=3")
        ):
            got.append(chunk.choices[0].delta.content or "")
    assert len(got) == 4  # the role chunk and three tokens arrived before the error


def test_reset_mid_stream_breaks_the_body(sim: Proc) -> None:
    raw = read_until_eof(open_request(sim, "/v1/chat/completions", stream_body(),
                                      {**fault("reset-after=3"), "connection": "close"}))  # fmt: skip
    assert raw.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding: chunked" in raw.lower()
    assert raw.count(b'"delta":{"content":" ') == 3
    assert not raw.endswith(b"0\r\n\r\n")  # no terminating chunk: the body is incomplete
    assert b"[DONE]" not in raw
    got: list[str] = []
    with client_for(sim) as client, pytest.raises(openai.APIConnectionError):
        for chunk in client.chat.completions.create(
            model="sim-model", messages=MSGS, stream=True, extra_headers=fault("reset-after=3")
        ):
            got.append(chunk.choices[0].delta.content or "")
    assert len(got) == 4


def test_reset_unary_closes_without_response(sim: Proc) -> None:
    body = {"model": "sim-model", "messages": MSGS}
    assert read_until_eof(open_request(sim, "/v1/chat/completions", body, fault("reset"))) == b""
    with client_for(sim) as client, pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(
            model="sim-model", messages=MSGS, extra_headers=fault("reset")
        )


def test_hang_then_disconnect_counts_abort(sim: Proc) -> None:
    aborted = metric(sim, ABORTED)
    sock = open_request(sim, "/v1/chat/completions", {"model": "sim-model", "messages": MSGS},
                        fault("hang"))  # fmt: skip
    wait_for("the request running", lambda: metric(sim, RUNNING) == 1, 10, every=0.02)
    sock.close()
    wait_for("the request aborted", lambda: metric(sim, ABORTED) == aborted + 1
             and metric(sim, RUNNING) == 0, 10, every=0.02)


def test_hang_after_streams_n_tokens_then_stalls(sim: Proc) -> None:
    aborted = metric(sim, ABORTED)
    sock = open_request(sim, "/v1/chat/completions", stream_body(), fault("hang-after=2"))
    data = read_until(sock, b"data: ", 3)  # role + 2 tokens
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(65536)  # nothing more comes
    assert data.count(b'"content":" ') == 2
    sock.close()
    wait_for("the request aborted", lambda: metric(sim, ABORTED) == aborted + 1
             and metric(sim, RUNNING) == 0, 10, every=0.02)


def test_slow_sets_inter_token_latency(sim: Proc) -> None:
    with client_for(sim) as client:
        start = time.perf_counter()
        chunks = list(client.completions.create(model="sim-model", prompt="x", max_tokens=4,
                                                stream=True, extra_headers=fault("slow=100")))  # fmt: skip
        elapsed = time.perf_counter() - start
    assert len(chunks) == 4
    assert 0.3 <= elapsed < 3  # three gaps of 100 ms between four tokens


def test_disconnect_during_itl_sleep_aborts(start_sim: StartSim) -> None:
    proc = start_sim("--itl-ms", "300", "--output-tokens", "50")
    sock = open_request(proc, "/v1/completions", {"prompt": "x", "stream": True}, {})
    read_until(sock, b"data: ", 1)
    assert metric(proc, RUNNING) == 1
    sock.close()
    wait_for("the request aborted",
             lambda: metric(proc, ABORTED) == 1 and metric(proc, RUNNING) == 0, 3, every=0.02)
    assert metric(proc, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(proc, "vllm:generation_tokens_total") < 5


def test_requests_over_max_num_seqs_wait(start_sim: StartSim) -> None:
    proc = start_sim("--max-num-seqs", "1", "--ttft-ms", "600")
    results: list[str] = []

    def one() -> None:
        with client_for(proc) as client:
            resp = client.completions.create(model="sim-model", prompt="x", max_tokens=2)
            results.append(resp.choices[0].finish_reason)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for("a request waiting", lambda: metric(proc, "vllm:num_requests_waiting") == 1, 10,
             every=0.02)
    assert metric(proc, RUNNING) == 1
    for t in threads:
        t.join(10)
    assert results == ["length", "length"]
    assert metric(proc, RUNNING) == 0 and metric(proc, "vllm:num_requests_waiting") == 0
