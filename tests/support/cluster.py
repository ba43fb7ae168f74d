"""A real control plane (`llmgw server`) with the simulators and gateways started against it,
and small chat calls through a gateway with a key."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from llmgw.cli.ctl.client import Client
from llmgw.secrets.datadir import read_admin_token
from tests.support.procs import Proc, start_process

SERVER_READY = "llmgw control plane listening on"
GATEWAY_READY = "llmgw gateway listening on"
SIM_READY = "llmgw-sim listening on"


class Cluster:
    """One control plane and the processes started against it; everything stops at the end."""

    def __init__(self, tmp: Path, settings: dict[str, Any] | None = None, store: str | None = None) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.procs: list[Proc] = []
        args = [sys.executable, "-m", "llmgw.cli.main", "server", "--data-dir", str(self.data_dir),
                "--port", "0"]
        if store:
            args += ["--store", store]
        if settings:
            cfg = tmp / "server.yaml"
            cfg.write_text(json.dumps({"control_plane": settings}))
            args += ["--config", str(cfg)]
        self.server = self._start(args, SERVER_READY)
        self.admin = Client(self.server.url, read_admin_token(self.data_dir), timeout=30)

    def _start(self, args: list[str], ready: str) -> Proc:
        proc = start_process(args, ready, timeout=60)
        self.procs.append(proc)
        return proc

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One admin API call that must succeed; returns its JSON."""
        answer = self.admin.call(method, path, body=None if body is None else json.dumps(body).encode())
        assert answer.status < 300, (method, path, answer.status, answer.body)
        return json.loads(answer.body)

    def request_record(self, rid: str) -> dict[str, Any] | None:
        """GET /api/v1/requests/{rid}: the request's record, or None while it has none."""
        answer = self.admin.call("GET", f"/api/v1/requests/{rid}")
        if answer.status == 404:
            return None
        assert answer.status == 200, answer.body
        view: dict[str, Any] = json.loads(answer.body)
        return view

    def key(self, limits: dict[str, Any] | None = None, project_limits: dict[str, Any] | None = None) -> dict[str, Any]:
        """A key in a fresh project acme/ml/<n>; returns the issued key (with `key`, `id`)."""
        if not self.call("GET", "/api/v1/orgs"):
            self.call("POST", "/api/v1/orgs", {"name": "acme"})
            self.call("POST", "/api/v1/teams", {"org": "acme", "name": "ml"})
        name = f"p{len(self.call('GET', '/api/v1/projects'))}"
        self.call("POST", "/api/v1/projects", {"team": "acme/ml", "name": name,
                                               **({"limits": project_limits} if project_limits else {})})
        body: dict[str, Any] = {"project": f"acme/ml/{name}", "name": "test"}
        if limits:
            body["limits"] = limits
        issued: dict[str, Any] = self.call("POST", "/api/v1/keys", body)
        return issued

    def sim(self, *args: str) -> Proc:
        """A simulator serving sim-model."""
        return self._start([sys.executable, "-m", "llmgw.engines.sim", "--port", "0",
                            "--model", "sim-model", *args], SIM_READY)

    def gateway(self, sim: Proc, workers: int = 1) -> Proc:
        """A gateway in front of `sim`, taking keys and limits from this control plane; returned
        once it is ready (`GET /ready`: keys received and the replica healthy), as a load
        balancer's readiness probe would wait. Its listening line comes when the port accepts,
        which may be before the first snapshot: a request then gets 503 `not ready`."""
        gw = self._start([sys.executable, "-m", "llmgw.cli.main", "gateway", "--port", "0",
                          "--workers", str(workers), "--endpoint", f"sim-0={sim.url}=sim-model",
                          "--control-plane", self.server.url, "--data-dir", str(self.data_dir)],
                         GATEWAY_READY)
        # Each connection may reach another worker: every one must have answered ready.
        deadline, streak = time.monotonic() + 30, 0
        while streak < 3 * workers:
            assert time.monotonic() < deadline, f"gateway never ready:\n{gw.output[-3000:]}"
            streak = streak + 1 if _status(gw.url + "/ready") == 200 else 0
            if not streak:
                time.sleep(0.05)
        return gw

    def stop(self) -> None:
        """Stops everything, newest first."""
        for p in reversed(self.procs):
            p.terminate()


def chat(url: str, key: str, max_tokens: int = 5, timeout: float = 10,
         headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One small chat completion through a gateway with `key` (and `headers`): its HTTP status
    and its request id (the answer's x-request-id, the gateway's own)."""
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST", headers={
        "authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return int(r.status), r.headers.get("x-request-id", "")
    except urllib.error.HTTPError as e:
        with e:  # closes its connection: a collected one warns
            return int(e.code), e.headers.get("x-request-id", "")


def chat_status(url: str, key: str, max_tokens: int = 5, timeout: float = 10) -> int:
    """The HTTP status of one small chat completion through a gateway, with `key`."""
    return chat(url, key, max_tokens, timeout)[0]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code)
    except OSError:
        return 0
