"""The fleet end to end with real processes: a control plane, two agents with simulated GPUs,
simulator engines; a node lost and its replica placed again; an engine that keeps crashing."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from tests.support.fleet import Fleet
from tests.support.procs import chat, wait_for


def _ready(f: Fleet, n: int) -> list[dict[str, Any]] | None:
    reps = [r for r in f.replicas() if r["state"] == "ready"]
    return reps if len(reps) == n else None


def test_two_nodes_one_replica_each_then_a_node_is_lost(fleet_factory: Callable[..., Fleet]) -> None:
    # The settle lets both agents register before anything is placed, so the replicas
    # spread over them rather than fill the first node that came up.
    f = fleet_factory(placement_settle=6)
    f.start_agents("n1", "n2")
    ready = wait_for("two ready replicas", lambda: _ready(f, 2))
    assert sorted(r["node"] for r in ready) == ["n1", "n2"]  # spread: one on each node
    nodes = f.get("/api/v1/nodes")
    assert [(n["id"], n["state"], n["simulated"], len(n["gpus"])) for n in nodes] == [
        ("n1", "ready", True, 2), ("n2", "ready", True, 2)]

    # The gateways' snapshot lists both, with URLs that answer with the engine key only.
    snap = wait_for("both replicas in the snapshot",
                    lambda: (s := f.snapshot()) and len(s["replicas"]) == 2 and s)
    assert [m["name"] for m in snap["models"]] == ["sim-model"]
    assert sorted(r["id"] for r in snap["replicas"]) == sorted(r["id"] for r in ready)
    for entry in snap["replicas"]:
        assert chat(entry["url"], entry["engine_key"]) == 200
        assert chat(entry["url"], None) == 401

    # n1 is lost (agent and engines killed): its replica is placed on n2, exactly once.
    lost = next(r for r in ready if r["node"] == "n1")
    f.kill_node("n1")
    wait_for("n1 lost", lambda: any(n["id"] == "n1" and n["state"] == "lost"
                                    for n in f.get("/api/v1/nodes")))
    now = wait_for("two ready replicas on n2", lambda: _ready(f, 2))
    assert [r["node"] for r in now] == ["n2", "n2"]
    assert sorted(tuple(r["gpus"]) for r in now) != [tuple(now[0]["gpus"])] * 2  # one per GPU
    every = f.replicas(every=True)
    assert len(every) == 3
    old = next(r for r in every if r["id"] == lost["id"])
    assert (old["state"], old["reason"]) == ("stopped", "node n1 was lost")
    snap = wait_for("the snapshot without the lost replica",
                    lambda: (s := f.snapshot()) and lost["id"] not in
                    {r["id"] for r in s["replicas"]} and len(s["replicas"]) == 2 and s)
    for entry in snap["replicas"]:
        assert chat(entry["url"], entry["engine_key"]) == 200


def test_engine_crashes_restart_then_park(fleet_factory: Callable[..., Fleet]) -> None:
    model = {"name": "crashy", "source": {"repo": "sim/crashy"}, "min_replicas": 1,
             "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "H100-80GB"}]}
    f = fleet_factory([model])
    f.agent("n1", "1xH100-80GB")
    [r] = wait_for("a ready replica", lambda: _ready(f, 1))
    pid = r["pid"]
    for restarts in (1, 2):
        os.killpg(pid, signal.SIGKILL)
        r = wait_for(f"restart {restarts}", lambda n=restarts: next(  # type: ignore[misc]
            (x for x in f.replicas() if x["state"] == "ready" and x["restarts"] == n), None))
        assert r["pid"] != pid
        pid = r["pid"]
    os.killpg(pid, signal.SIGKILL)
    parked = wait_for("parked", lambda: next(
        (x for x in f.replicas() if x["state"] == "parked"), None))
    assert parked["reason"].startswith("the engine failed 3 times within 60s, so it is parked")
    [m] = f.get("/api/v1/models")
    assert (m["parked"], m["ready"]) == (1, 0)
    assert m["reason"].startswith(f"replica {parked['id']} is parked: the engine failed 3 times")
    # Parked holds its GPU: nothing else is placed while it is parked.
    assert [x["id"] for x in f.replicas()] == [parked["id"]]
    status, done = f.post("/api/v1/restart", {"replicas": [parked["id"]]})
    assert (status, done) == (200, [{"replica": parked["id"], "how": "started again in place"}])
    [event] = [e for e in f.get("/api/v1/audit") if e["action"] == "replica.restart"]
    assert (event["target"], event["after"]["restarted"]) == (parked["id"], done)
    wait_for("ready again", lambda: _ready(f, 1))
