"""Limits across gateway workers, end to end: real gateways, the simulator, the stand-in authority."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from llmgw.protocol.wire import Limits
from tests.support.control_stub import ControlStub
from tests.support.gateway import Gateway, http_get, metric_value, start_sim
from tests.support.gateway_cp import CHAT, chat, control, start_authed
from tests.support.procs import Proc

__all__ = ["control"]


def _sim_requests(sim: Proc) -> float:
    return metric_value(http_get(sim.url + "/metrics"), "vllm:request_success_total")


def _burst(gw: Gateway, key: str, n: int, threads: int,
           body: dict[str, Any] | None = None) -> list[tuple[int, dict[str, str], Any]]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: chat(gw, key, body), range(n)))


def test_four_workers_forward_at_most_the_rpm_of_a_key(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, entry = control.add_key(limits=Limits(rpm=60))
    # A longer lease wait than the default: on a loaded test machine a slow lease call
    # must not turn into a 503 (that fail mode has its own test).
    gw = start_authed(gateway_factory, sim.url, control, {"workers": 4, "control_plane": {
        "url": control.url, "lease_wait": 3.0}})
    before = _sim_requests(sim)
    results = _burst(gw, key, 150, 16)
    codes = [r[0] for r in results]
    ok = codes.count(200)
    forwarded = _sim_requests(sim) - before
    # By construction: every forwarded request holds a unit counted in the window.
    assert forwarded == ok <= 60, (ok, forwarded, codes)
    # Units stranded in workers' shares may refuse a few early, never admit more.
    assert ok >= 40, codes
    assert set(codes) == {200, 429}
    _, hdrs, body = next(r for r in results if r[0] == 429)
    e = body["error"]
    assert (e["type"], e["code"], e["param"]) == ("requests", "rate_limit_exceeded", None)
    assert e["message"].startswith(f"the requests per minute limit of key {entry.key_id} is reached; it frees in ")
    retry = int(hdrs["retry-after"])
    assert 1 <= retry <= 60
    assert e["message"].endswith(f"; retry after {retry}s")
    assert control.state.limits.window_units(f"key:{entry.key_id}") <= 60


def test_concurrency_limit_holds_across_workers_and_slots_come_back(
        gateway_factory: Callable[..., Gateway], control: ControlStub) -> None:
    # Each answer streams for about a second, so the admitted requests overlap.
    with start_sim("--model", "sim-model", "--itl-ms", "100") as slow:
        control.projects["proj_a"] = Limits(concurrency=3)
        key, _ = control.add_key()
        gw = start_authed(gateway_factory, slow.url, control, {"workers": 4})
        body = {**CHAT, "max_tokens": 10}
        results = _burst(gw, key, 12, 12, body)
        codes = sorted(r[0] for r in results)
        # All 12 were sent at once and the admitted ones ran ~1 s: they were in flight together.
        assert codes.count(200) <= 3 and codes.count(200) >= 1, codes
        assert set(codes) <= {200, 429}
        e = next(r for r in results if r[0] == 429)[2]["error"]
        assert e["message"].startswith("the concurrent requests limit of project proj_a is reached")
        scope = "project:proj_a"
        control.wait_limits(lambda a: a.in_flight(scope) == 0)
        # A client that leaves mid-stream gives its slot back too.
        s = socket.create_connection((gw.url.split("//")[1].split(":")[0], gw.proc.port))
        payload = b'{"model":"sim-model","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"x"}]}'
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(payload)).encode()
                  + b"\r\n\r\n" + payload)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        control.wait_limits(lambda a: a.in_flight(scope) >= 1)
        s.close()
        control.wait_limits(lambda a: a.in_flight(scope) == 0)


def test_slots_come_back_on_every_error_path(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, entry = control.add_key(limits=Limits(concurrency=2))
    gw = start_authed(gateway_factory, sim.url, control, {"workers": 2})
    faults = ["fail=500", "fail=400", "error-after=1", "reset-after=1", "fail=429"]
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(
            lambda f: chat(gw, key, {**CHAT, "stream": "after" in f},
                           headers={"x-sim-fault": f}), faults * 2))
    codes = {r[0] for r in results}
    assert codes <= {200, 400, 429, 502, 503}, codes  # 503: the replica was ejected by the 500s
    control.wait_limits(lambda a: a.in_flight(f"key:{entry.key_id}") == 0)


def test_a_budget_stops_a_project_and_says_until_when(
        gateway_factory: Callable[..., Gateway], sim: Proc, tmp_path: Path) -> None:
    calls: list[tuple[str, float]] = []

    async def used_tokens(scope: str, start: float) -> int:
        calls.append((scope, start))
        return 90 if scope == "project:proj_b" else 0

    d = tmp_path / "cp2"
    d.mkdir()
    stub = ControlStub(d, used_tokens).start()
    try:
        stub.projects["proj_b"] = Limits(budget_tokens=100, budget_period="day")
        key, _ = stub.add_key(project="proj_b")
        gw = start_authed(gateway_factory, sim.url, stub, {"workers": 2})
        codes = []
        rids = []
        for _ in range(20):
            status, hdrs, body = chat(gw, key)
            codes.append(status)
            rids.append(hdrs["x-request-id"])
            if status == 429:
                break
        # 90 of 100 used before: a request or two fit, then the budget refuses.
        assert codes[-1] == 429 and set(codes[:-1]) == {200}, codes
        finals = stub.wait_usage(lambda bs: len([f for b in bs for f in b.ended()]) >= len(codes) - 1)
        used = [f.prompt_tokens + f.completion_tokens for b in finals for f in b.ended()]
        # The stated bound: one request per worker and scope past the budget.
        assert sum(used) - max(used) < 10, used
        e = body["error"]
        assert (e["type"], e["code"]) == ("tokens", "rate_limit_exceeded")
        assert e["message"].startswith("the token budget limit of project proj_b is reached")
        now = time.time()
        until_midnight = 86400 - now % 86400
        assert abs(int(hdrs["retry-after"]) - math.ceil(until_midnight)) <= 5
        assert calls and calls[0][0] == "project:proj_b" and calls[0][1] == now - now % 86400
    finally:
        stub.stop()


@pytest.mark.parametrize("fail_open", [False, True])
def test_when_the_control_plane_is_gone_limits_fail_closed_unless_configured(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub, fail_open: bool) -> None:
    key, _ = control.add_key(limits=Limits(rpm=1000))
    gw = start_authed(gateway_factory, sim.url, control, {"control_plane": {
        "url": control.url, "limits_fail_open": fail_open, "lease_wait": 0.3}})
    control.stop()
    # Units already held admit for up to their ttl (1 s); then the fail mode shows.
    codes = []
    deadline = time.monotonic() + (3 if fail_open else 10)
    while time.monotonic() < deadline:
        status, _, body = chat(gw, key)
        codes.append(status)
        if status != 200:
            break
    if fail_open:
        assert set(codes) == {200}, codes
    else:
        assert status == 503, codes
        assert body["error"]["code"] == "limits_unavailable"
        assert body["error"]["message"].startswith("limits cannot be checked (")
