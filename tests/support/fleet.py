"""A real control plane with a fleet: `llmgw server` with models in its server.yaml, and agents
with simulated GPUs that start real simulator engines (`Fleet`); two control planes on one
PostgreSQL that fail over (`Pair`); keys issued and keyed traffic sent through a gateway."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.control_plane import READY, Server, start_server
from tests.support.procs import Proc, free_port, killpg, start_process
from tests.support.sim import sim_env

AGENT_READY = "llmgw-agent registered"

SIM_MODEL = {
    "name": "sim-model",
    "source": {"repo": "sim/sim-model"},
    "min_replicas": 2,
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "H100-80GB", "gpu_count": 1,
                  "gpu_memory": "70GiB"}],
}
# Short enough that a lost node is replaced within seconds; the heartbeat well inside them.
FAST = {"reconcile_every": 0.2, "heartbeat_interval": 0.25, "unreachable_after": 1.5,
        "lost_after": 3, "max_failures": 3, "failure_window": 60,
        "restart_backoff_initial": 0.2, "restart_backoff_max": 1, "drain_timeout": 2}


class Fleet:
    """`llmgw server` on an admin port and an agent port it picks and names, and the agents
    started against it."""

    def __init__(self, tmp: Path, models: list[dict[str, Any]], **settings: Any) -> None:
        self.tmp = tmp
        self.server = start_server(tmp, config={
            "control_plane": {"agent_insecure": True, "agent_port": 0, **FAST, **settings},
            "models": models,
        }, env=sim_env())
        self.agent_port = self.server.agent_port
        self.agents: dict[str, Proc] = {}

    def agent(self, node_id: str, gpus: str = "2xH100-80GB") -> Proc:
        """`llmgw agent` with simulated GPUs, registered as `node_id`."""
        low = free_port(41)
        try:
            proc = start_process(
                [sys.executable, "-m", "llmgw", "agent", "--control-plane",
                 f"127.0.0.1:{self.agent_port}", "--insecure", "--fake-gpus", gpus, "--node-id",
                 node_id, "--port-range", f"{low}-{low + 40}", "--engine-host", "127.0.0.1",
                 "--heartbeat-interval", "0.25"], AGENT_READY, timeout=30, env=sim_env())
        except RuntimeError as e:  # most often the control plane's fault: say what it printed
            raise RuntimeError(f"{e}\nthe control plane printed:\n{self.server.proc.output}") from None
        self.agents[node_id] = proc
        return proc

    def start_agents(self, *node_ids: str, gpus: str = "2xH100-80GB") -> None:
        """Several agents started at once (they register within a moment of each other)."""
        with ThreadPoolExecutor(len(node_ids)) as pool:
            list(pool.map(lambda n: self.agent(n, gpus), node_ids))

    def get(self, path: str) -> Any:
        """An admin GET that must answer 200."""
        status, _, body = self.server.call("GET", path)
        assert status == 200, (path, status, body)
        return body

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """An admin POST: (status, JSON)."""
        status, _, doc = self.server.call("POST", path, body=json.dumps(body).encode(),
                                          headers={"content-type": "application/json"})
        return status, doc

    def replicas(self, every: bool = False) -> list[dict[str, Any]]:
        """GET /api/v1/replicas (with stopped ones when `every`)."""
        result: list[dict[str, Any]] = self.get("/api/v1/replicas" + ("?all=true" if every else ""))
        return result

    def snapshot(self) -> dict[str, Any]:
        """The gateways' snapshot, as a gateway fetches it."""
        status, _, body = self.server.call("GET", "/internal/v1/snapshot", token="gateway")
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    def kill_node(self, node_id: str) -> None:
        """A machine lost: SIGKILL the agent's group and its engines (each in its own group)."""
        pids = [r["pid"] for r in self.replicas() if r["node"] == node_id and r["pid"]]
        for pid in pids:
            killpg(pid)
        self.agents[node_id].kill()

    def stop(self) -> None:
        """Agents first (they drain their engines), then the server. A server that no longer
        answers still has its agents and its own process stopped; engines whose pids it can
        no longer tell go at the end of the run (tests/conftest.py)."""
        try:
            pids = [r["pid"] for r in self.replicas(every=True) if r["pid"]]
        except OSError:
            pids = []
        for a in self.agents.values():
            a.terminate()
        for pid in pids:
            killpg(pid)
        self.server.proc.terminate()


TTL = 2.0
# A failover takes the rest of the dead leader's lease, then up to a third of a TTL until
# the standby's next try, then attaching the parts (loading the fleet from the store).
TAKEOVER_SLACK = TTL / 3 + 2.0
# Agents come back after a failover within their reconnect back-off (0.5 s doubling), so a
# node must not be declared lost in the meantime: lost_after well above the failover time.
HA = {**FAST, "unreachable_after": 10, "lost_after": 60, "leader_lease_ttl": TTL}


class Pair:
    """Two control planes on one PostgreSQL, sharing a data dir (the same secret and tokens)."""

    def __init__(self, tmp: Path, store: str) -> None:
        self.tmp = tmp
        self.store = store
        self.data_dir = tmp / "data"
        self.servers: list[Server] = []
        self.agent_ports: list[int] = []
        self.agents: dict[str, Proc] = {}

    def server(self, name: str, models: list[dict[str, Any]] | None = None) -> Server:
        """`llmgw server` with its own admin and agent ports (and `SIM_MODEL` unless `models`)."""
        cfg = self.tmp / f"{name}.yaml"
        cfg.write_text(json.dumps({"control_plane": {"agent_insecure": True, "agent_port": 0,
                                                     **HA},
                                   "models": [SIM_MODEL] if models is None else models}))
        # Each server's connections carry its name, so a test can tell whose writes it sees.
        store = f"{self.store}?application_name=llmgw-{name}"
        proc = start_process([sys.executable, "-m", "llmgw", "server", "--data-dir",
                              str(self.data_dir), "--store", store, "--port",
                              "0", "--config", str(cfg)], READY, timeout=30,
                             env=sim_env())
        srv = Server(proc, proc.url, self.data_dir,
                     (self.data_dir / "admin-token").read_text().strip())
        self.servers.append(srv)
        self.agent_ports.append(srv.agent_port)
        return srv

    def agent(self, node_id: str, control_planes: list[int]) -> Proc:
        """`llmgw agent` with one simulated GPU (room for one replica: the two replicas land one
        on each node) that knows the given agent ports, in that order."""
        low = free_port(41)
        targets = ",".join(f"127.0.0.1:{p}" for p in control_planes)
        proc = start_process(
            [sys.executable, "-m", "llmgw", "agent", "--control-plane", targets, "--insecure",
             "--fake-gpus", "1xH100-80GB", "--node-id", node_id, "--port-range",
             f"{low}-{low + 40}", "--engine-host", "127.0.0.1", "--heartbeat-interval", "0.25"],
            AGENT_READY, timeout=30, env=sim_env())
        self.agents[node_id] = proc
        return proc

    def stop(self) -> None:
        pids: set[int] = set()
        for srv in self.servers:
            if srv.proc.popen.poll() is None:
                with contextlib.suppress(AssertionError, OSError):
                    pids |= {r["pid"] for r in get(srv, "/api/v1/replicas?all=true") if r["pid"]}
        for a in self.agents.values():
            a.terminate()
        for pid in pids:
            killpg(pid)
        for srv in self.servers:
            srv.proc.terminate()


def get(srv: Server, path: str) -> Any:
    """An admin GET that must answer 200."""
    status, _, body = srv.call("GET", path)
    assert status == 200, (path, status, body)
    return body


Post = Callable[[str, dict[str, Any]], tuple[int, Any]]


def issue_key(post: Post, name: str = "load", *, first: bool = True) -> str:
    """A new API key of the project acme/ml/chat, made (when `first`) through `post` (an admin
    POST answering (status, JSON))."""
    for path, body in (("/api/v1/orgs", {"name": "acme"}),
                       ("/api/v1/teams", {"org": "acme", "name": "ml"}),
                       ("/api/v1/projects", {"team": "acme/ml", "name": "chat"})) if first else ():
        status, doc = post(path, body)
        assert status == 201, (path, status, doc)
    status, issued = post("/api/v1/keys", {"project": "acme/ml/chat", "name": name})
    assert status == 201, issued
    key: str = issued["key"]
    return key


class Load:
    """Threads sending chat completions through the gateway, one after another, recording
    (start, end, status, why, request id) of each until stopped."""

    def __init__(self, url: str, key: str, threads: int = 4) -> None:
        self.url, self.key = url, key
        self.done: list[tuple[float, float, int, str, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _one(self) -> tuple[int, str, str]:
        body = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
        req = urllib.request.Request(f"{self.url}/v1/chat/completions", body, {
            "content-type": "application/json", "authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                resp.read()
                return int(resp.status), "", resp.headers.get("x-request-id", "")
        except urllib.error.HTTPError as exc:
            return (int(exc.code), exc.read().decode(errors="replace")[:300],
                    exc.headers.get("x-request-id", ""))
        except OSError as exc:
            return 0, repr(exc), ""

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            status, why, rid = self._one()
            self.done.append((start, time.monotonic(), status, why, rid))

    def stop(self) -> list[tuple[float, float, int, str, str]]:
        self._stop.set()
        for t in self._threads:
            t.join(20)
        return self.done


def keyed_chat(url: str, key: str, messages: list[dict[str, str]] | None) -> int:
    """A chat completion's status; with no messages, one for a model nobody serves (404 once
    the key is known, 401 before)."""
    model, msgs = ("sim-model", messages) if messages else ("no-such-model", [])
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": 2}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", body, {
        "content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # its connection, else a ResourceWarning when collected
        return int(exc.code)
