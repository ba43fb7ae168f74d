"""Several granian workers behave as one gateway from the outside."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

from tests.procs import Proc

from .conftest import Gateway


def test_metrics_and_usage_cover_every_worker(gateway_factory: Callable[..., Gateway], sim: Proc) -> None:
    gw = gateway_factory([f"r1={sim.url}=sim-model"], {"workers": 2})
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    for _ in range(16):
        # A new connection each time, so the kernel spreads them over both workers.
        req = urllib.request.Request(gw.base_url + "/chat/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    recs = gw.usage(16)
    # Request ids start with a per-worker prefix: both workers answered.
    assert len({r["request_id"][:12] for r in recs}) == 2
    # Whichever worker answers the scrape, it reports the counts of both.
    assert gw.metric("llmgw_requests_total", model="sim-model", status="ok") == 16
    assert gw.metric("llmgw_tokens_total", model="sim-model", kind="completion") == 32
