"""`llmgw up`: llmgw on one machine, answering at http://127.0.0.1:8080/v1.

Today this is a local engine simulator and the gateway in front of it; the
control-plane issue turns it into a control plane, a gateway and a local agent.
"""

from __future__ import annotations

import argparse
import atexit
import socket
import subprocess
import sys

from llmgw.config import Endpoint, GatewayConfig

from .gateway import serve


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `up`."""
    parser.add_argument("--host", default="127.0.0.1", help="address of the gateway (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port of the gateway (default 8080)")
    parser.add_argument("--model", default="sim-model", help="name of the simulated model (default sim-model)")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="simulated time to first token (default 20)")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="simulated time between tokens (default 10)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(args: argparse.Namespace) -> int:
    """Starts the simulator as a child process, then serves the gateway in front of it."""
    port = _free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "llmgw.sim", "--port", str(port), "--model", args.model,
         "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)],
        stdout=subprocess.PIPE, text=True,
    )
    atexit.register(sim.terminate)
    assert sim.stdout is not None
    line = sim.stdout.readline()
    if "listening on" not in line:
        print("error: the engine simulator did not start; run `llmgw engine sim` to see why", file=sys.stderr)
        return 1
    print(f"llmgw up: no GPU engine configured; serving {args.model!r} from the engine SIMULATOR "
          f"at http://127.0.0.1:{port} (simulated text, not a real model)", flush=True)
    cfg = GatewayConfig(
        host=args.host, port=args.port,
        endpoints=[Endpoint(id="sim-0", url=f"http://127.0.0.1:{port}", models=[args.model])],
    )
    try:
        serve(cfg)
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    return 0
