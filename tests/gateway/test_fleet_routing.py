"""Replicas the control plane places, and scale from zero, end to end.

A real gateway process against the control-plane stand-in (`control_stub`), real
simulators as the engines. The stub publishes replicas and models in its snapshot
the way the reconciler will, and records the wakes gateways ask for.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from llmgw.admin.route import ApiError
from llmgw.protocol.wire import ModelEntry, ReplicaEntry
from tests.support.control_stub import ControlStub
from tests.support.gateway import Gateway, start_sim
from tests.support.gateway_cp import chat, control, request
from tests.support.procs import Proc

__all__ = ["control"]

MSG = [{"role": "user", "content": "hi"}]


def start_fleet_gateway(gateway_factory: Callable[..., Gateway], stub: ControlStub) -> Gateway:
    """A gateway with no configured endpoint: everything it routes to comes from the stub."""
    before = stub.state.first_polls
    gw = gateway_factory([], {}, "--control-plane", stub.url, "--data-dir", str(stub.data_dir))
    stub.wait_first_polls(before + 1)
    return gw


def body(model: str = "m", **kw: object) -> dict[str, object]:
    return {"model": model, "messages": MSG, "max_tokens": 2, **kw}


def finals(stub: ControlStub, n: int) -> list[dict[str, object]]:
    """The first n finished requests' records the gateway shipped."""
    batches = stub.wait_usage(lambda bs: sum(len(b.ended()) for b in bs) >= n)
    return [{"request_id": r.request_id, "replica": r.replica, "status": r.status, "http_status": r.http_status}
            for b in batches for r in b.ended()]


@pytest.fixture
def keyed_sims() -> Iterator[tuple[Proc, Proc]]:
    """Two simulators serving `m`, each refusing requests without its own engine key."""
    with start_sim("--model", "m", "--api-key", "key-a") as a, start_sim("--model", "m", "--api-key", "key-b") as b:
        yield a, b


def test_published_replicas_are_routed_to_with_their_engine_key(
    gateway_factory: Callable[..., Gateway], control: ControlStub, keyed_sims: tuple[Proc, Proc]
) -> None:
    a, b = keyed_sims
    key, _ = control.add_key()
    gw = start_fleet_gateway(gateway_factory, control)
    assert chat(gw, key, body())[0] == 404  # nothing placed, nothing in the catalog yet
    v = control.publish(models=[ModelEntry(name="m", aliases=["gpt-m"])],
                        replicas=[ReplicaEntry(id="pa", model="m", url=a.url, engine_key="key-a"),
                                  ReplicaEntry(id="pb", model="m", url=b.url, engine_key="key-b")])
    control.wait_applied(v)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: chat(gw, key, body("gpt-m" if i % 2 else "m")), range(16)))
    assert [s for s, _, _ in answers] == [200] * 16
    assert {x["model"] for _, _, x in answers} == {"m", "gpt-m"}
    recs = finals(control, 16)
    assert {r["replica"] for r in recs} <= {"pa", "pb"} and all(r["status"] == "ok" for r in recs)
    status, _, models = request(gw.base_url + "/models", None, key)
    assert status == 200 and [m["id"] for m in models["data"]] == ["gpt-m", "m"]
    # The engine key is what lets the request through: a wrong one is the engine's 401, relayed.
    v = control.publish(replicas=[ReplicaEntry(id="pa2", model="m", url=a.url, engine_key="key-b")])
    control.wait_applied(v)
    assert chat(gw, key, body())[0] == 401


def test_a_removed_replica_gets_no_new_request_and_its_stream_finishes(
    gateway_factory: Callable[..., Gateway], control: ControlStub, tmp_path: Path
) -> None:
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    with start_sim("--model", "m", "--itl-ms", "40", "--output-tokens", "40", "--request-log", str(log_a)) as a, \
            start_sim("--model", "m", "--request-log", str(log_b)) as b:
        key, _ = control.add_key()
        gw = start_fleet_gateway(gateway_factory, control)
        control.wait_applied(control.publish(models=[ModelEntry(name="m")],
                                             replicas=[ReplicaEntry(id="pa", model="m", url=a.url)]))
        c = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=20)
        stream = c.chat.completions.create(model="m", messages=MSG, stream=True, max_tokens=40)
        chunks = [next(iter(stream))]  # the stream runs on pa, the only replica
        # pa drains: the control plane takes it out of the snapshot before it stops.
        control.wait_applied(control.publish(replicas=[ReplicaEntry(id="pb", model="m", url=b.url)]))
        after = []
        for _ in range(6):
            status, headers, _ = chat(gw, key, body())
            assert status == 200
            after.append(headers["x-request-id"])
        chunks += list(stream)
        assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert len(text) > 0
        recs = finals(control, 7)
    streamed = [r for r in recs if r["request_id"] not in after]
    assert streamed == [{"request_id": streamed[0]["request_id"], "replica": "pa", "status": "ok",
                         "http_status": 200}]
    assert {r["replica"] for r in recs if r["request_id"] in after} == {"pb"}
    assert not [line for line in log_a.read_text().splitlines() if line.split()[0] in after]
    assert len(log_b.read_text().splitlines()) == 6


def test_a_model_with_no_replica_wakes_one_and_the_requests_wait_for_it(
    gateway_factory: Callable[..., Gateway], control: ControlStub
) -> None:
    with start_sim("--model", "m", "--api-key", "key-a") as a:
        key, _ = control.add_key()
        gw = start_fleet_gateway(gateway_factory, control)
        control.wait_applied(control.publish(models=[ModelEntry(name="m", scale_up_timeout=20)]))
        # The gateway is ready with no replica at all: a request wakes one.
        assert request(gw.url + "/ready", None)[0] == 200

        def place(model: str) -> None:
            # A second later, as an engine that starts; from a thread, since publish()
            # waits on the stub's loop, which runs this callback.
            entry = ReplicaEntry(id="p1", model=model, url=a.url, engine_key="key-a")
            threading.Timer(1.0, control.publish, kwargs={"replicas": [entry]}).start()

        control.state.on_wake = place
        t0 = time.monotonic()
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: chat(gw, key, body()), range(5)))
        waited = time.monotonic() - t0
    assert [s for s, _, _ in answers] == [200] * 5
    assert control.state.wakes == ["m"]  # five requests, one wake
    assert 0.9 < waited < 10
    assert gw.metric("llmgw_scale_from_zero_waits_total", model="m", outcome="ready") == 5


def test_no_replica_within_the_timeout_is_a_503_that_says_so(
    gateway_factory: Callable[..., Gateway], control: ControlStub
) -> None:
    key, _ = control.add_key()
    gw = start_fleet_gateway(gateway_factory, control)
    control.wait_applied(control.publish(models=[ModelEntry(name="m", aliases=["gpt-m"], scale_up_timeout=1)]))
    t0 = time.monotonic()
    status, headers, answer = chat(gw, key, body("gpt-m"))
    assert time.monotonic() - t0 >= 1.0
    assert (status, headers["retry-after"], answer) == (503, "1", {"error": {
        "message": "model 'gpt-m' had no ready replica; one is being started but was not ready within 1s; "
                   "retry after 1s",
        "type": "service_unavailable", "param": None, "code": "scale_up_timeout"}})
    assert control.state.wakes == ["m"]  # the alias woke the model it stands for


def test_a_refused_wake_is_a_503_with_the_control_planes_reason(
    gateway_factory: Callable[..., Gateway], control: ControlStub
) -> None:
    key, _ = control.add_key()
    gw = start_fleet_gateway(gateway_factory, control)
    control.wait_applied(control.publish(models=[ModelEntry(name="m"), ModelEntry(name="n", scale_from_zero=False)]))

    def refuse(model: str) -> None:
        raise ApiError(409, "fleet.no_placement", "no node has 2 free H100-80GB GPUs; `llmgw ctl explain-placement m`")

    control.state.on_wake = refuse
    status, headers, answer = chat(gw, key, body())
    assert (status, headers["retry-after"], answer["error"]["code"]) == (503, "1", "no_placement")
    assert answer["error"]["message"] == (
        "model 'm' has no ready replica and the control plane cannot start one: no node has 2 free "
        "H100-80GB GPUs; `llmgw ctl explain-placement m`")
    status, _, answer = chat(gw, key, body("n"))
    assert (status, answer["error"]["code"]) == (503, "no_placement")
    assert "does not scale from zero" in answer["error"]["message"]
    assert control.state.wakes == ["m"]


def test_a_client_gone_while_waiting_is_never_forwarded(
    gateway_factory: Callable[..., Gateway], control: ControlStub, tmp_path: Path
) -> None:
    log = tmp_path / "sim.log"
    with start_sim("--model", "m", "--request-log", str(log)) as sim:
        key, _ = control.add_key()
        gw = start_fleet_gateway(gateway_factory, control)
        control.wait_applied(control.publish(models=[ModelEntry(name="m", scale_up_timeout=20)]))
        u = urlsplit(gw.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body()),
                     headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
        control.wait_wakes(1)
        conn.close()
        deadline = time.monotonic() + 10
        while gw.metric("llmgw_scale_from_zero_waits_total", model="m", outcome="gone") < 1:
            assert time.monotonic() < deadline, "the gateway never saw the client go"
            time.sleep(0.05)
        control.wait_applied(control.publish(replicas=[ReplicaEntry(id="p1", model="m", url=sim.url)]))
        status, headers, _ = chat(gw, key, body())
        assert status == 200
        stayed = headers["x-request-id"]
        assert [line.split()[0] for line in log.read_text().splitlines()] == [stayed]
    assert [r["request_id"] for r in finals(control, 1)] == [stayed]
