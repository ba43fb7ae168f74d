"""A gateway told to stop (SIGTERM) exits cleanly and loses no usage record."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import openai

from tests.procs import Proc

from .conftest import Gateway


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
