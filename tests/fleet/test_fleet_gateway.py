"""A gateway in front of the fleet while a node is lost: two agents with
simulated GPUs, one replica on each, a real gateway routing keyed traffic to them from the
control plane's snapshot. The node of one replica is killed under load; every request that
started after the gateway learned of the loss (the replica left its routing table) succeeds."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.support.cluster import GATEWAY_READY
from tests.support.fleet import SIM_MODEL, Fleet, Load, issue_key, keyed_chat
from tests.support.gateway import SYSTEM, TOKENIZER, metric_value
from tests.support.procs import Proc, start_process, wait_for
from tests.support.sim import sim_env

_HEALTHY = re.compile(r'^llmgw_replica_healthy\{replica="([^"]+)"\} ', re.MULTILINE)


def _gateway(f: Fleet, config: dict[str, Any] | None = None) -> Proc:
    args = [sys.executable, "-m", "llmgw", "gateway", "--port", "0",
            "--control-plane", f.server.url, "--data-dir", str(f.server.data_dir)]
    if config is not None:
        path = f.tmp / "gateway.yaml"
        path.write_text(json.dumps({"gateway": config}))
        args += ["--config", str(path)]
    return start_process(args, GATEWAY_READY, timeout=30, env=sim_env())


def _routed(gateway: Proc) -> set[str]:
    """The replicas the gateway routes to now, from its /metrics."""
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as resp:
        return set(_HEALTHY.findall(resp.read().decode()))


def test_no_request_fails_after_the_gateway_learned_a_node_was_lost(
        fleet_factory: Callable[..., Fleet]) -> None:
    f = fleet_factory(placement_settle=6)
    f.start_agents("n1", "n2")
    ready = wait_for("two ready replicas", lambda: (
        reps := [r for r in f.replicas() if r["state"] == "ready"]) and len(reps) == 2 and reps)
    assert sorted(r["node"] for r in ready) == ["n1", "n2"]
    lost = next(r for r in ready if r["node"] == "n1")["id"]

    gateway = _gateway(f)
    try:
        wait_for("the gateway routes to both replicas",
                 lambda: _routed(gateway) == {r["id"] for r in ready})
        key = issue_key(f.post)
        wait_for("the key known to the gateway", lambda: keyed_chat(gateway.url, key, None) == 404)
        load = Load(gateway.url, key)
        wait_for("requests flowing", lambda: len(load.done) >= 20)

        f.kill_node("n1")
        killed_at = time.monotonic()
        # When the gateway learned: its routing table no longer has the lost replica
        # (polled every 50 ms, so `learned` is at most 50 ms late: a stricter bound).
        deadline = killed_at + 30
        while lost in _routed(gateway):
            assert time.monotonic() < deadline, "the gateway never dropped the lost replica"
            time.sleep(0.05)
        learned = time.monotonic()
        # Keep the load on past the lost timeout, while the replacement is placed on n2.
        wait_for("the replacement ready on n2", lambda: [
            r for r in f.replicas() if r["state"] == "ready" and r["node"] == "n2"
            and r["id"] != lost][1:], timeout=30)
        time.sleep(1.0)
        done = load.stop()
    finally:
        gateway.terminate()

    after = [d for d in done if d[0] >= learned]
    failed_after = [d for d in after if d[2] != 200]
    failed_before = [d for d in done if d[0] < learned and d[2] != 200]
    print(f"{len(done)} requests; learned {learned - killed_at:.2f}s after the kill; "
          f"{len(after)} started after it, {len(failed_after)} of them failed; "
          f"{len(failed_before)} failed before")
    assert len(after) >= 20, "too few requests after the gateway learned to show anything"
    assert failed_after == [], failed_after[:5]


def test_kv_events_of_placed_engines_reach_the_gateway_and_route_a_shared_prefix(
        fleet_factory: Callable[..., Fleet]) -> None:
    # The agents start the simulator engines with KV-event publishing on two ports of their
    # range; the snapshot carries the endpoints; the gateway subscribes and routes by them.
    model = {**SIM_MODEL, "profiles": [{**SIM_MODEL["profiles"][0],  # type: ignore[index]
                                        "args": ["--tokenizer", TOKENIZER]}]}
    f = fleet_factory([model], placement_settle=6)
    f.start_agents("n1", "n2")
    snap = wait_for("two replicas in the snapshot with KV endpoints", lambda: (
        s := f.snapshot()) and len(s["replicas"]) == 2
        and all(r["kv_events"] and r["kv_replay"] for r in s["replicas"]) and s)
    for r in snap["replicas"]:
        assert r["kv_events"].startswith("tcp://127.0.0.1:")
    gateway = _gateway(f, {"routing": {"sim-model": {"policy": "kv", "tokenizer": TOKENIZER}}})
    try:
        wait_for("the gateway routes to both replicas", lambda: len(_routed(gateway)) == 2)
        key = issue_key(f.post)
        # A new key reaches the gateway with the next snapshot, within a second or so.
        wait_for("the key known to the gateway", lambda: keyed_chat(gateway.url, key, None) == 404)
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
        assert keyed_chat(gateway.url, key, turn1) == 200
        wait_for("the first request's blocks in the gateway's KV index",
                 lambda: _metric(gateway, "llmgw_kv_index_blocks") > 0, timeout=10)
        turn2 = [*turn1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        assert keyed_chat(gateway.url, key, turn2) == 200
        hits = _metric(gateway, "llmgw_routing_decisions_total", model="sim-model", policy="kv",
                       kind="cache_hit")
    finally:
        gateway.terminate()
    assert hits == 1


def _metric(gateway: Proc, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as resp:
        return metric_value(resp.read().decode(), name, **labels)
