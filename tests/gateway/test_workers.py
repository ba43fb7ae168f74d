"""Several granian workers behave as one gateway from the outside."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

from tests.support.gateway import Gateway
from tests.support.procs import Proc


def test_metrics_and_usage_cover_every_worker(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"workers": 2})
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    workers: set[str] = set()
    sent = 0
    # The second worker may bind its socket a little after the first: send (a
    # new connection each time, spread by the kernel) until both have answered.
    deadline = time.monotonic() + 30
    while len(workers) < 2 and time.monotonic() < deadline:
        req = urllib.request.Request(gw.base_url + "/chat/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
            # Request ids start with a per-worker prefix.
            workers.add(r.headers["x-request-id"][:12])
        sent += 1
    assert len(workers) == 2
    assert len(gw.usage(sent)) == sent
    # Whichever worker answers the scrape, it reports the counts of both.
    assert gw.metric("llmgw_requests_total", model="sim-model", status="ok") == sent
    assert gw.metric("llmgw_tokens_total", model="sim-model", kind="completion") == 2 * sent
