"""`python -m bench.up`: `llmgw up --engine sim` (or `--engine llamacpp`) to its first answered request, timed.

Each run starts `llmgw up` on a fresh data dir (so the first-start bootstrap is
in the figure: data dir, store migration, the default project and its key),
then sends a chat completion with the key it printed every 20 ms until one is
answered 200. The figure is the time from starting the process to that answer:
control plane, agent, placement, the simulator's start and the gateway
learning the replica. The target is under 10 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import Server, free_port
from llmgw.cli.up import DEFAULT_MODELS

KEY = re.compile(r"(sk-llmgw-[A-Za-z0-9_-]{40})")


def answered(port: int, key: str, model: str) -> bool:
    """One chat completion through the gateway; True on a 200."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"authorization": f"Bearer {key}", "content-type": "application/json"})
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def one_run(timeout: float, engine: str) -> float:
    """Seconds from starting `llmgw up` to its first answered request."""
    with tempfile.TemporaryDirectory(prefix="llmgw-up-bench-") as tmp:
        port = free_port()
        args = [sys.executable, "-m", "llmgw.cli.main", "up", "--engine", engine, "--port", str(port),
                "--admin-port", str(free_port()), "--agent-port", str(free_port()),
                "--data-dir", str(Path(tmp) / "data"), "--ttft-ms", "0", "--itl-ms", "0"]
        t0 = time.perf_counter()
        up = Server("llmgw up", args, port)
        try:
            key = ""
            while time.perf_counter() - t0 < timeout:
                if up.popen.poll() is not None:
                    raise RuntimeError(f"llmgw up exited with {up.popen.returncode}:\n{up.tail()}")
                if not key:
                    m = next((KEY.search(x) for x in up.lines if KEY.search(x)), None)
                    key = m.group(1) if m else ""
                if key and answered(port, key, DEFAULT_MODELS[engine]):
                    return time.perf_counter() - t0
                time.sleep(0.02)
            raise RuntimeError(f"no answer within {timeout:g}s:\n{up.tail()}")
        finally:
            up.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.up", description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", choices=sorted(DEFAULT_MODELS), default="sim")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    times = [one_run(args.timeout, args.engine) for _ in range(args.runs)]
    result = {
        "scenario": "up",
        "engine": args.engine,
        "runs": args.runs,
        "first_answer_s_median": round(statistics.median(times), 2),
        "first_answer_s_max": round(max(times), 2),
        "first_answer_s": [round(t, 2) for t in times],
        "target_s": 10 if args.engine == "sim" else None,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
