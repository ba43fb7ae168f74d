"""Simulator and gateway processes for the gateway's end-to-end tests, calling a gateway, and
reading what it wrote: its usage log and its /metrics."""

from __future__ import annotations

import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.procs import Proc, start_process

SIM_READY = "llmgw-sim listening on"
GATEWAY_READY = "llmgw gateway listening on"

SYSTEM = "You are a careful assistant. " * 40
"""A system prompt long enough that conversations sharing it share whole KV blocks."""
TOKENIZER = str(Path(__file__).resolve().parents[2] / "rust" / "tests" / "fixtures" / "tiny-bpe")
"""A small tokenizer the simulator and the router both read (`--tokenizer`, `tokenizer:`)."""


def start_sim(*args: str) -> Proc:
    """A simulator process on a port of its own (`--port 0`: its ready line names it)."""
    return start_process([sys.executable, "-m", "llmgw.engines.sim", "--port", "0", *args], SIM_READY)


class Gateway:
    """A running gateway process and what it wrote."""

    def __init__(self, proc: Proc, usage_log: Path) -> None:
        self.proc = proc
        self.usage_log = usage_log
        self.url = proc.url
        self.base_url = proc.url + "/v1"

    def usage(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Waits until the usage log holds at least n records; returns them all."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.usage_log.read_text().splitlines() if self.usage_log.exists() else []
            if len(lines) >= n or time.monotonic() > deadline:
                return [json.loads(x) for x in lines]
            time.sleep(0.05)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample from the gateway's /metrics (0 when absent)."""
        return metric_value(http_get(self.url + "/metrics"), name, **labels)


def http_get(url: str) -> str:
    """GET a URL; returns the body text."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def metric_value(text: str, name: str, **labels: str) -> float:
    """Finds a sample by name and (a subset of) its labels in a Prometheus exposition."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
            found = True
    return total if found else 0.0


def post(
    gw: Gateway, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """POST `body` to the gateway's `path`: its status, its headers (lower-cased), its JSON."""
    u = urlsplit(gw.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    conn.request(
        "POST", path, body=body, headers={"content-type": "application/json", **(headers or {})}
    )
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data) if data else None
