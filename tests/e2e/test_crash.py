"""A gateway killed with SIGKILL under load: every request it forwarded more than a second
before is accounted for exactly once (final, or settled as interrupted), none twice.

The engine's request log is the witness of what was forwarded; the control plane's
request records and its usage rollup are what was accounted.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster import Cluster

SILENT_FOR = 3.0
LOAD_FOR = 4.0


def _stream(url: str, key: str) -> None:
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 40, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST", headers={
        "authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        pass  # the gateway is killed under us: expected


def test_sigkill_under_load_accounts_each_forwarded_request_once(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"gateway_silent_for": SILENT_FOR})
    try:
        log = tmp_path / "received.log"
        # ~2 s per request, clients staggered: at the kill some requests are more than
        # a second into their stream, whatever the machine's load does to the timing.
        sim = cluster.sim("--request-log", str(log), "--ttft-ms", "20", "--itl-ms", "50",
                          "--output-tokens", "40")
        key = cluster.key()
        gw = cluster.gateway(sim)
        stop = threading.Event()

        def client(delay: float) -> None:
            time.sleep(delay)
            while not stop.is_set():
                _stream(gw.url, key["key"])

        threads = [threading.Thread(target=client, args=(i * 0.25,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(LOAD_FOR)
        killed_at = time.time()
        gw._signal(signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(timeout=30)

        forwarded = {line.split()[0]: float(line.split()[1]) for line in log.read_text().splitlines()}
        early = sorted(rid for rid, at in forwarded.items() if at < killed_at - 1.0)
        assert len(early) >= 8, f"too little load to mean anything: {len(early)}"

        # The control plane settles a silent gateway's open requests after SILENT_FOR
        # (checked every 2 s); wait for that, bounded.
        deadline = time.monotonic() + SILENT_FOR + 15
        while True:
            views = {rid: cluster.request_record(rid) for rid in early}
            pending = [rid for rid, v in views.items() if v is None or v["state"] == "open"]
            if not pending:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"{len(pending)} of {len(early)} forwarded requests never accounted: {pending[:5]}")
            time.sleep(0.5)
        states = [v["state"] for v in views.values() if v is not None]
        assert set(states) <= {"final", "interrupted"}
        assert "interrupted" in states, "some requests were mid-stream at the kill"

        # None twice: the rollup counts exactly the requests that have a record.
        accounted = [rid for rid in forwarded
                     if (v := cluster.request_record(rid)) is not None and v["state"] != "open"]
        rows = cluster.call("GET", "/api/v1/usage?by=project&since=1h")
        assert sum(r["requests"] for r in rows) == len(accounted)
        # The control plane's metrics say how many it settled: every interrupted record.
        interrupted = sum(1 for rid in accounted
                          if (v := cluster.request_record(rid)) and v["state"] == "interrupted")
        with urllib.request.urlopen(cluster.server.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert f"llmgw_usage_settled_total {float(interrupted)}" in text.splitlines()
        print(f"{len(forwarded)} forwarded, {len(early)} more than 1 s before the kill, "
              f"{states.count('interrupted')} of those settled as interrupted, {len(accounted)} accounted")
    finally:
        cluster.stop()
