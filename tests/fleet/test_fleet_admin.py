"""The fleet's admin routes and `llmgw ctl` commands against a real control plane and agent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ctl.test_ctl import ctl
from tests.support.fleet import Fleet
from tests.support.procs import wait_for

BIG = {"name": "big", "source": {"repo": "org/big"}, "min_replicas": 1,
       "profiles": [{"name": "h200", "engine": "sim", "gpu_class": "H200-141GB"}]}


def test_nodes_models_and_placement_questions(fleet_factory: Callable[..., Fleet], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    f = fleet_factory()
    f.agent("n1")
    wait_for("two ready replicas", lambda: len([r for r in f.replicas() if r["state"] == "ready"]) == 2)
    base = ("--server", f.server.url, "--token", f.server.admin_token)

    code, out, _ = ctl(capsys, *base, "nodes", "list")
    assert code == 0 and "2 x H100-80GB (simulated)" in out and "n1" in out
    code, out, _ = ctl(capsys, *base, "models", "list")
    assert code == 0 and "sim-model" in out and "config" in out

    # A model no node can take: explain-placement says why, on each node.
    spec = tmp_path / "big.yaml"
    spec.write_text(json.dumps(BIG))
    code, out, err = ctl(capsys, *base, "models", "add", str(spec))
    assert code == 0, err
    wait_for("big unplaced", lambda: f.get("/api/v1/models/big")["unplaced"] == 1)
    code, out, _ = ctl(capsys, *base, "explain-placement", "--model", "big")
    doc = json.loads(out)
    assert [(v["node"], v["ok"], [r["code"] for r in v["reasons"]]) for v in doc["nodes"]] == [
        ("n1", False, ["placement.wrong_gpu_class"])]
    assert "has no H200-141GB GPU" in doc["nodes"][0]["reasons"][0]["message"]
    [big] = [m for m in f.get("/api/v1/models") if m["name"] == "big"]
    assert big["reason"] == ("1 replica(s) cannot be placed; `llmgw ctl explain-placement big` "
                             "says why on each node")

    # Headroom: n1's two GPUs are taken by sim-model's 70 GiB replicas.
    code, out, _ = ctl(capsys, *base, "headroom", "sim-model")
    assert json.loads(out)["count"] == 0
    status, doc = f.post("/api/v1/models/sim-model/scale", {"replicas": 5})
    assert (status, doc["error"]["code"]) == (400, "models.bad_scale")

    # Removing: a model from server.yaml is refused; one added through the API goes.
    status, _, doc = f.server.call("DELETE", "/api/v1/models/sim-model")
    assert (status, doc["error"]["code"]) == (409, "models.in_config")
    code, out, _ = ctl(capsys, *base, "models", "remove", "big")
    assert (code, out) == (0, "removed model big\n")

    # Cordon and drain: with nowhere else to go, the replicas stay where they are.
    code, out, _ = ctl(capsys, *base, "nodes", "state", "n1", "cordon")
    assert code == 0
    wait_for("cordoned", lambda: f.get("/api/v1/nodes")[0]["state"] == "cordoned")
    status, _, doc = f.server.call("DELETE", "/api/v1/nodes/n1")
    assert (status, doc["error"]["code"]) == (409, "nodes.not_empty")

    # Logs come from the agent.
    rid = f.replicas()[0]["id"]
    code, out, err = ctl(capsys, *base, "nodes", "logs", "n1", "--source", rid, "--lines", "5")
    assert code == 0, err
    [entry] = json.loads(out)
    assert entry["replica"] == rid and 0 < len(entry["lines"]) <= 5

    code, out, _ = ctl(capsys, *base, "replicas", "--model", "sim-model")
    assert code == 0 and rid in out

    # Every change above is in the audit log, with what it changed (every change
    # made through the admin API is). A refused one (the scale to 5, the removals) is not.
    events = {(e["action"], e["target"]): e for e in f.get("/api/v1/audit")}
    assert set(events) == {("model.add", "model:big"), ("model.remove", "model:big"), ("node.cordon", "node:n1")}
    assert events[("model.add", "model:big")]["after"]["name"] == "big"
    assert events[("model.remove", "model:big")]["before"]["name"] == "big"
    cordon = events[("node.cordon", "node:n1")]
    admin_state = f.get("/api/v1/nodes")[0]["admin_state"]
    assert (cordon["before"]["admin_state"], cordon["after"]["admin_state"], cordon["actor"]) == (
        "ready", admin_state, "admin") and admin_state != "ready"
    status, doc = f.post("/api/v1/models/sim-model/scale", {"replicas": 2})  # its bounds are 2 to 2
    assert status == 200, doc
    [scale] = [e for e in f.get("/api/v1/audit") if e["action"] == "model.scale"]
    assert (scale["target"], scale["before"]["wanted"], scale["after"]["wanted"]) == ("model:sim-model", 2, 2)
