"""A real control plane with a fleet: `llmgw server` with models in its server.yaml, and agents
with simulated GPUs that start real simulator engines."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.control_plane import start_server
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
    """`llmgw server` on a free admin port and agent port, and the agents started against it."""

    def __init__(self, tmp: Path, models: list[dict[str, Any]], **settings: Any) -> None:
        self.tmp = tmp
        self.agent_port = free_port()
        self.server = start_server(tmp, config={
            "control_plane": {"agent_insecure": True, "agent_port": self.agent_port, **FAST,
                              **settings},
            "models": models,
        }, env=sim_env())
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
