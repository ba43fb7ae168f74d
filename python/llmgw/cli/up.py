"""`llmgw up`: llmgw on one machine, answering at http://127.0.0.1:8080/v1.

A control plane (`llmgw server`, admin API at 127.0.0.1:8081, the embedded
SQLite store in the data dir), a local engine simulator, and the gateway in
front of it, asking for API keys the control plane issued. At the first start
the store is empty: `up` creates the tenancy `default/default/default` and
issues one key, printed once, so the first request can be made at once.
The control-plane issue replaces the simulator with a local agent.
"""

from __future__ import annotations

import argparse
import atexit
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from llmgw.config import ControlPlane, Endpoint, GatewayConfig

from .gateway import serve

DEFAULT_PATH = "default/default/default"


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `up`."""
    from llmgw.control.settings import default_data_dir

    parser.add_argument("--host", default="127.0.0.1", help="address of the gateway (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port of the gateway (default 8080)")
    parser.add_argument("--admin-port", type=int, default=8081,
                        help="port of the control plane's admin API, on 127.0.0.1 (default 8081)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"secret, admin token and SQLite store (default {default_data_dir()})")
    parser.add_argument("--model", default="sim-model", help="name of the simulated model (default sim-model)")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="simulated time to first token (default 20)")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="simulated time between tokens (default 10)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _child(args: list[str], ready: str, what: str) -> subprocess.Popen[str]:
    """Starts a child, waits for its ready line; raises SystemExit with a sentence when it fails."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    atexit.register(proc.terminate)
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        if ready in line:
            # Keep draining: a child blocked on a full pipe would stop serving.
            threading.Thread(target=_echo, args=(proc.stdout,), daemon=True).start()
            return proc
        seen.append(line.rstrip())
    tail = "\n  ".join(seen[-5:]) or "(nothing)"
    raise SystemExit(f"error: {what} did not start; it said:\n  {tail}")


def _echo(stream: IO[str]) -> None:
    for line in stream:
        sys.stderr.write(line)


def _bootstrap(admin_url: str, data_dir: Path) -> str | None:
    """Creates default/default/default and issues a key when the store has no organization;
    returns the plaintext key (None when the store already had a tenancy)."""
    from llmgw.control.datadir import read_admin_token

    from .ctl.client import Client

    client = Client(admin_url, read_admin_token(data_dir), timeout=30)

    def call(method: str, path: str, body: dict[str, object] | None = None) -> object:
        answer = client.call(method, path, body=None if body is None else json.dumps(body).encode())
        if answer.status >= 300:
            raise SystemExit(f"error: setting up the default project failed: {answer.body.decode(errors='replace')}")
        return json.loads(answer.body)

    if call("GET", "/api/v1/orgs"):
        return None
    call("POST", "/api/v1/orgs", {"name": "default"})
    call("POST", "/api/v1/teams", {"org": "default", "name": "default"})
    call("POST", "/api/v1/projects", {"team": "default/default", "name": "default"})
    issued = call("POST", "/api/v1/keys", {"project": DEFAULT_PATH, "name": "quickstart"})
    assert isinstance(issued, dict)
    return str(issued["key"])


def run(args: argparse.Namespace) -> int:
    """Starts the control plane and the simulator as children, then serves the gateway."""
    from llmgw.control.settings import default_data_dir

    data_dir = (args.data_dir or default_data_dir()).expanduser().absolute()
    admin_url = f"http://127.0.0.1:{args.admin_port}"
    server = _child([sys.executable, "-m", "llmgw.cli.main", "server", "--data-dir", str(data_dir),
                     "--port", str(args.admin_port)],
                    "llmgw control plane listening on", "the control plane (llmgw server)")
    sim_port = _free_port()
    sim = _child([sys.executable, "-m", "llmgw.sim", "--port", str(sim_port), "--model", args.model,
                  "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)],
                 "listening on", "the engine simulator (llmgw engine sim)")
    key = _bootstrap(admin_url, data_dir)
    print(f"llmgw up: control plane at {admin_url} (data in {data_dir}); no GPU engine configured, so "
          f"{args.model!r} is served by the engine SIMULATOR at http://127.0.0.1:{sim_port} "
          "(simulated text, not a real model)", flush=True)
    if key is not None:
        print(f"llmgw up: created project {DEFAULT_PATH} and its first API key (shown once, keep it):\n"
              f"    {key}", flush=True)
    else:
        print(f"llmgw up: issue an API key with `llmgw ctl keys issue {DEFAULT_PATH} NAME`", flush=True)
    cfg = GatewayConfig(
        host=args.host, port=args.port,
        endpoints=[Endpoint(id="sim-0", url=f"http://127.0.0.1:{sim_port}", models=[args.model])],
        control_plane=ControlPlane(url=admin_url, data_dir=str(data_dir)),
    )
    try:
        serve(cfg)
    finally:
        for child in (sim, server):
            child.terminate()
        for child in (sim, server):
            child.wait(timeout=10)
    return 0
