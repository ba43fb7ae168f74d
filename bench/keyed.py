"""The `llmgw-keys` target: llmgw's gateway with API keys, limits and usage on.

The target: the throughput scenario with keys and usage on stays within 10%
of it without them. This target is that gateway: a control plane (`llmgw server`,
a fresh data dir, its SQLite store), an org/team/project and a key whose rpm and tpm
limits are far above what the bench can send (so every request takes the limiter's
path and none is refused), and `llmgw gateway --control-plane URL --data-dir DIR`
in front of the same upstream as plain `llmgw`. The load generator sends the key as
`Authorization: Bearer`.

After the rounds, `usage_check` compares what the control plane counted (`GET
/api/v1/usage?by=project&since=1h`) with the 200s the gateway itself says it answered
(its `llmgw_requests_total{status="ok"}`): exact usage means they are equal. It also
says what the control plane spent per counted request (`llmgw_keys_cp_cpu_us`): its
CPU from `start_cpu` (before the rounds) to the end of the check, less what it spends
idle (measured by `start_cpu`, about 0-5 ms a second: snapshot polls, settle loop).
The gateway's CPU per request is in the throughput figures.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

from bench.procs import Server, free_port, group_cpu_ns
from llmgw.cli.ctl.client import Client
from llmgw.secrets.datadir import read_admin_token

NAME = "llmgw-keys"
# Far above anything two cores can send (the bench reaches ~10^4 req/s, ~4x10^5 tokens/s):
# the limiter runs on every request and never refuses one.
LIMITS = {"rpm": 1_000_000_000, "tpm": 1_000_000_000_000}


class Keyed:
    """The control plane, the key and the keyed gateway; `stop` ends both servers."""

    def __init__(self, bin_path: str, upstream: str, model: str, workdir: Path, workers: int = 1) -> None:
        self.data_dir = workdir / "keys-data"
        port = free_port()
        self.server_args = [
            bin_path,
            "server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(port),
        ]
        self.server = Server("llmgw-server", self.server_args, port)
        self.gateway: Server | None = None
        _wait_line(self.server, "llmgw control plane listening on", 60)
        self.admin = Client(self.server.url, read_admin_token(self.data_dir), timeout=30)
        self._call("POST", "/api/v1/orgs", {"name": "bench"})
        self._call("POST", "/api/v1/teams", {"org": "bench", "name": "load"})
        self._call(
            "POST", "/api/v1/projects", {"team": "bench/load", "name": "p", "limits": LIMITS}
        )
        issued = self._call(
            "POST", "/api/v1/keys", {"project": "bench/load/p", "name": "bench", "limits": LIMITS}
        )
        self.key: str = issued["key"]
        gport = free_port()
        self.gateway_args = [
            bin_path,
            "gateway",
            "--endpoint",
            f"sim={upstream}={model}",
            "--port",
            str(gport),
            "--workers",
            str(workers),
            "--control-plane",
            self.server.url,
            "--data-dir",
            str(self.data_dir),
        ]
        self.gateway = Server(NAME, self.gateway_args, gport)
        self.gateway.wait_ready(60, "/health", "llmgw gateway listening on")
        self._cpu0 = self._t0 = self._idle = 0.0

    def _cp_cpu(self) -> float:
        # schedstat's nanoseconds, not stat's 10 ms ticks: the idle rate (a few ms a
        # second) is scaled by the whole run, and a tick of error there was ~5 µs a request.
        return group_cpu_ns(self.server.pid) / 1e9

    def start_cpu(self, idle_s: float = 2.0) -> None:
        """Measures the control plane's idle CPU rate, then starts counting its CPU."""
        c0, t0 = self._cp_cpu(), time.monotonic()
        time.sleep(idle_s)
        self._cpu0, self._t0 = self._cp_cpu(), time.monotonic()
        self._idle = (self._cpu0 - c0) / (self._t0 - t0)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = self.admin.call(
            method, path, body=None if body is None else json.dumps(body).encode()
        )
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status} {answer.body[:300]!r}")
        return json.loads(answer.body)

    def gateway_ok(self) -> int:
        """200s the gateway says it answered (its Prometheus counter, status ok)."""
        assert self.gateway is not None
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("llmgw_requests_total{") and 'status="ok"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def counted(self) -> int:
        """Requests the control plane's usage rollup holds for the last hour."""
        rows = self._call("GET", "/api/v1/usage?by=project&since=1h")
        return int(sum(r["requests"] for r in rows))

    def usage_check(self, wait_s: float = 15.0) -> dict[str, float | None]:
        """Waits (bounded) until the rollup stops moving and equals the gateway's 200s."""
        ok = self.gateway_ok()
        deadline = time.monotonic() + wait_s
        counted = self.counted()
        while counted != ok and time.monotonic() < deadline:
            time.sleep(0.5)  # the gateway ships a batch every fraction of a second
            counted = self.counted()
        cp_cpu: float | None = None
        if self._t0 and counted:
            spent = self._cp_cpu() - self._cpu0 - self._idle * (time.monotonic() - self._t0)
            cp_cpu = max(spent, 0.0) / counted * 1e6
        return {
            "llmgw_keys_gateway_ok": float(ok),
            "llmgw_keys_usage_counted": float(counted),
            "llmgw_keys_usage_exact": 1.0 if counted == ok else 0.0,
            "llmgw_keys_cp_cpu_us": cp_cpu,
        }

    def stop(self) -> None:
        """Stops the gateway first (it ships its last usage on SIGTERM), then the control plane."""
        if self.gateway is not None:
            self.gateway.stop()
        self.server.stop()


def _wait_line(srv: Server, line: str, timeout: float) -> None:
    # Every admin route wants the token, so there is no unauthenticated probe: the
    # server prints its line once the listener is bound.
    deadline = time.monotonic() + timeout
    while not any(line in x for x in srv.lines):
        if srv.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{srv.name} not ready:\n{srv.tail()}")
        time.sleep(0.1)
