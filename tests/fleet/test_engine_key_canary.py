"""Engine keys never leave the path gateway -> engine (docs/reliability.md, canary secrets).

A control plane places a replica through a real agent; its engine key (derived from the
cluster secret, given to the engine in its environment) is published to gateways only.
It must not appear in any admin answer (nodes, replicas, models, the engine's own logs
fetched through the admin API) nor in anything the server or the agent printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.support.fleet import SIM_MODEL, Fleet
from tests.support.procs import chat, wait_for


def test_engine_keys_are_only_in_the_gateways_snapshot(fleet_factory: Callable[..., Fleet]) -> None:
    f = fleet_factory([{**SIM_MODEL, "min_replicas": 1}])
    f.agent("n1", "1xH100-80GB")
    snap = wait_for("a published replica", lambda: (s := f.snapshot()) and s["replicas"] and s)
    [entry] = snap["replicas"]
    engine_key = entry["engine_key"]
    assert len(engine_key) >= 32
    assert chat(entry["url"], engine_key) == 200 and chat(entry["url"], "x" + engine_key[1:]) == 401
    texts = [json.dumps(f.get(p)) for p in ("/api/v1/nodes", "/api/v1/replicas?all=true", "/api/v1/models",
                                             "/api/v1/models/sim-model", "/api/v1/audit?limit=100")]
    logs = f.get(f"/api/v1/nodes/n1/logs?source={entry['id']}&lines=0")
    assert logs and logs[0]["lines"], "the engine's log was fetched"
    texts.append(json.dumps(logs))
    status, _, doc = f.server.call("GET", "/internal/v1/snapshot")  # with the admin token: refused
    assert status in (401, 403)
    texts.append(json.dumps(doc))
    texts += [f.server.proc.output, *(a.output for a in f.agents.values())]
    for needle in (engine_key, engine_key[-12:], engine_key[8:24]):
        assert not [t[:200] for t in texts if needle in t], "an engine key (or part of it) is in an output"
