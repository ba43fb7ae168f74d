"""The fleet's rows on both backends: nodes keep their recorded states across a new
registration, models and scale, replicas and their pruning."""

from __future__ import annotations

import pytest

from llmgw.store import Database
from llmgw.store import fleet as f
from llmgw.store.errors import Taken
from llmgw.store.snapshot import snapshot_version
from tests.support.store import with_db


def test_nodes(store_url: str) -> None:
    async def body(db: Database) -> None:
        n = f.NodeRow(id="n1", hostname="h1", labels={"zone": "a"},
                      inventory={"gpus": [{"uuid": "SIM-1", "simulated": True}]},
                      last_heartbeat=10.0, registered_at=10.0)
        await f.save_node(db, n)
        await f.set_node_state(db, "n1", "unreachable", "no heartbeat for 31 s")
        assert await f.set_admin_state(db, "n1", "cordoned")
        assert not await f.set_admin_state(db, "n2", "cordoned")
        n.hostname, n.last_heartbeat = "h1b", 20.0  # registers again: states are kept
        await f.save_node(db, n)
        await f.touch_nodes(db, {"n1": 25.0})
        [got] = await f.list_nodes(db)
        assert (got.hostname, got.state, got.admin_state, got.reason, got.last_heartbeat) == (
            "h1b", "unreachable", "cordoned", "no heartbeat for 31 s", 25.0)
        assert got.labels == {"zone": "a"} and got.inventory["gpus"][0]["simulated"] is True
        await f.insert_replica(db, f.ReplicaRow(id="m-1", model="m", profile="p", node="n1",
                                                created_at=1, updated_at=1))
        await f.delete_node(db, "n1")
        assert await f.list_nodes(db) == [] and await f.list_replicas(db) == []

    with_db(store_url, body)


def test_models_and_scale(store_url: str) -> None:
    async def body(db: Database) -> None:
        v0 = await snapshot_version(db)
        await f.add_model(db, "m", {"name": "m", "source": {"repo": "o/m"}}, now=5.0)
        assert await snapshot_version(db) == v0 + 1
        with pytest.raises(Taken):
            await f.add_model(db, "m", {"name": "m"})
        [row] = await f.list_models(db)
        assert (row.name, row.definition["source"], row.added_at) == ("m", {"repo": "o/m"}, 5.0)
        await f.set_scale(db, "m", 3)
        await f.set_scale(db, "m", 4)
        assert await f.scales(db) == {"m": 4}
        assert await f.delete_model(db, "m")
        assert not await f.delete_model(db, "m")
        assert await f.list_models(db) == [] and await f.scales(db) == {}

    with_db(store_url, body)


def test_replicas(store_url: str) -> None:
    async def body(db: Database) -> None:
        for i, t in ((1, 1.0), (2, 2.0), (3, 3.0)):
            await f.insert_replica(db, f.ReplicaRow(
                id=f"m-{i}", model="m", profile="p", node="n1", gpus=["SIM-1"],
                gpu_memory=70 << 30, cpu=0.5, memory=1 << 30, created_at=t, updated_at=t))
        await f.update_replica(db, "m-1", state="ready", port=20001, restarts=2, reason="", now=4)
        await f.update_replica(db, "m-2", state="stopped", port=None, restarts=0,
                               reason="node n1 was lost", now=5)
        await f.update_replica(db, "m-3", state="stopped", port=None, restarts=0, reason="", now=50)
        rows = await f.list_replicas(db)
        assert [(r.id, r.state, r.port, r.restarts) for r in rows] == [
            ("m-1", "ready", 20001, 2), ("m-2", "stopped", None, 0), ("m-3", "stopped", None, 0)]
        assert rows[0].gpus == ["SIM-1"] and rows[0].gpu_memory == 70 << 30
        assert rows[0].cpu == 0.5 and rows[1].reason == "node n1 was lost"
        assert await f.prune_replicas(db, before=10) == 1
        assert [r.id for r in await f.list_replicas(db)] == ["m-1", "m-3"]

    with_db(store_url, body)
