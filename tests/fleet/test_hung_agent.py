"""A hung agent (docs/reliability.md, "Agent stream cut / hung"): its process stops (SIGSTOP) with
its stream to the control plane still open, so only the missing heartbeats tell. The node
goes unreachable, then lost; its replica is placed on the other node; when the agent wakes
up, the replica it still runs is stopped, never kept as a second one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from tests.support.fleet import SIM_MODEL, Fleet
from tests.support.procs import wait_for


def _node_state(f: Fleet, node: str) -> str:
    return str(next(n["state"] for n in f.get("/api/v1/nodes") if n["id"] == node))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone too: the agent reaps its engines, but not while it is stopped.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_hung_agent_loses_its_node_and_its_replica_runs_once(fleet_factory: Callable[..., Fleet]) -> None:
    f = fleet_factory([{**SIM_MODEL, "min_replicas": 1}], placement_settle=3)
    f.start_agents("n1", "n2", gpus="1xH100-80GB")
    [first] = wait_for("a ready replica", lambda: [r for r in f.replicas() if r["state"] == "ready"])
    hung, other = first["node"], ({"n1", "n2"} - {first["node"]}).pop()
    agent = f.agents[hung]
    os.killpg(agent.popen.pid, signal.SIGSTOP)  # the agent only; its engine runs on
    try:
        wait_for(f"{hung} unreachable", lambda: _node_state(f, hung) == "unreachable", timeout=10)
        wait_for(f"{hung} lost", lambda: _node_state(f, hung) == "lost", timeout=10)

        def moved() -> list[dict[str, Any]] | None:
            ready = [r for r in f.replicas() if r["state"] == "ready"]
            return ready if [r["node"] for r in ready] == [other] else None

        [second] = wait_for(f"the replica ready on {other}", moved)
        assert second["id"] != first["id"]
        assert _alive(first["pid"]), "the hung node's engine still runs: only the agent hung"
    finally:
        os.killpg(agent.popen.pid, signal.SIGCONT)
    # Awake again: the old replica is stopped on its node, and only one replica is ready.
    wait_for(f"the old engine on {hung} stopped", lambda: not _alive(first["pid"]), timeout=15)
    time.sleep(1.0)  # a few reconcile passes: nothing is placed twice afterwards
    ready = [r for r in f.replicas() if r["state"] == "ready"]
    assert [(r["id"], r["node"]) for r in ready] == [(second["id"], other)], ready
    snap = f.snapshot()
    assert [r["id"] for r in snap["replicas"]] == [second["id"]]
