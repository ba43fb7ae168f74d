"""A gateway told to stop (SIGTERM) exits cleanly and loses no usage record."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import openai

from tests.support.gateway import Gateway, start_sim
from tests.support.procs import Proc, wait_for


def test_sigterm_flushes_usage_and_exits_0(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"])
    c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for _ in range(3):
        c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    # At once, before the periodic flush: only the shutdown path can write these.
    gw.proc.popen.send_signal(signal.SIGTERM)
    assert gw.proc.popen.wait(15) == 0
    lines = gw.usage_log.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["status"] == "ok" for x in lines)


def test_sigterm_lets_a_stream_in_flight_finish_and_refuses_new_connections(
        gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m", "--itl-ms", "50", "--output-tokens", "40") as sim:  # ~2 s
        gw = gateway_factory([f"r1={sim.url}=m"])
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
        stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=40, stream=True)
        chunks = [next(stream)]
        gw.proc.popen.send_signal(signal.SIGTERM)

        def refuses() -> bool:
            with openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=3) as new:
                try:
                    new.models.list()
                except openai.APIConnectionError:
                    return True
                return False

        wait_for("the gateway to stop accepting connections", refuses, timeout=10)
        chunks += list(stream)  # the stream in flight runs to its end
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
        assert gw.proc.popen.wait(15) == 0
    lines = [json.loads(x) for x in gw.usage_log.read_text().splitlines()]
    assert [(r["status"], r["completion_tokens"]) for r in lines] == [("ok", 40)]
