"""Starting a real `llmgw server` for a test, and calling it."""

from __future__ import annotations

import http.client
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.procs import Proc, start_process

READY = "llmgw control plane listening on"


@dataclass
class Server:
    """A running control plane: its process, URL, data dir and tokens."""

    proc: Proc
    url: str
    data_dir: Path
    admin_token: str

    @property
    def agent_port(self) -> int:
        """The agent service's port, as the ready line names it (one picked for agent_port 0)."""
        return self._port("agents connect on")

    @property
    def join_port(self) -> int:
        """The join port (mutual TLS), as the ready line names it."""
        return self._port("join on")

    def _port(self, said: str) -> int:
        ready = next(line for line in self.proc.lines if READY in line)
        m = re.search(re.escape(said) + r" \S+:(\d+)", ready)
        assert m, f"the ready line names no port after {said!r}: {ready!r}"
        return int(m.group(1))

    @property
    def gateway_token(self) -> str:
        """The gateway token, derived from the data dir's secret as gateways do."""
        from llmgw.secrets.keys import GATEWAY_TOKEN_LABEL, derive

        secret = bytes.fromhex((self.data_dir / "secret").read_text().strip())
        return derive(secret, GATEWAY_TOKEN_LABEL).hex()

    def call(self, method: str, path: str, token: str | None = "admin", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON body or text) of one request; token "admin"/"gateway"/a literal/None."""
        hdrs = dict(headers or {})
        if token is not None:
            value = {"admin": self.admin_token, "gateway": self.gateway_token}.get(token, token)
            hdrs["Authorization"] = f"Bearer {value}"
        conn = http.client.HTTPConnection("127.0.0.1", self.proc.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
        ctype = out_headers.get("content-type", "")
        if "json" not in ctype or not data:
            return resp.status, out_headers, data.decode()
        doc = json.loads(data)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            # Messages name the data dir, which is in tmp: tests read DATA for it.
            doc["error"]["message"] = doc["error"]["message"].replace(str(self.data_dir), "DATA")
        return resp.status, out_headers, doc


def up_ports(output: str) -> tuple[int, int]:
    """The admin port and the agent port that `llmgw up` names in its output (a port of 0 is
    the one picked; the gateway's is in its ready line, `Proc.port`)."""
    m = re.search(r"control plane at http://127\.0\.0\.1:(\d+) .*agent port 127\.0\.0\.1:(\d+)",
                  output)
    assert m, f"`llmgw up` named no admin and agent port:\n{output}"
    return int(m.group(1)), int(m.group(2))


def start_server(tmp_path: Path, store: str | None = None, *extra: str,
                 port: int | None = None, config: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> Server:
    """`llmgw server` on `port` (else on one it binds and names) with a fresh data dir under
    tmp_path: the one way the tests start a control plane (tests/fleet's `Fleet` too).

    `config` is written to tmp_path/server.yaml and passed with --config; `env` replaces
    the environment (the fleet's agents need `tests.support.sim.sim_env`)."""
    data_dir = tmp_path / "data"
    args = [sys.executable, "-m", "llmgw", "server", "--data-dir", str(data_dir),
            "--port", str(port or 0), *extra]
    if store is not None:
        args += ["--store", store]
    if config is not None:
        path = tmp_path / "server.yaml"
        path.write_text(json.dumps(config))  # YAML reads JSON
        args += ["--config", str(path)]
    proc = start_process(args, READY, timeout=30, env=env)
    token = (data_dir / "admin-token").read_text().strip()
    return Server(proc, proc.url, data_dir, token)


def scrape(server: Server) -> dict[str, float]:
    """Every sample of the control plane's GET /metrics (no token), keyed as the exposition
    writes it with the labels sorted: `name` or `name{a="x",b="y"}`."""
    from prometheus_client.parser import text_string_to_metric_families

    status, headers, text = server.call("GET", "/metrics", token=None)
    assert status == 200, text
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
