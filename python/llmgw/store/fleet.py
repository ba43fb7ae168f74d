"""The fleet's rows: nodes, models added at runtime, operators' scale, and replicas.

Plain rows only: the control plane (`llmgw.control.fleet`) turns them into its
inventory types, so this module imports nothing of the control plane. JSON
columns go in and out as Python values.

The control plane keeps the fleet in memory and writes through to these
tables; they are what a restarted or newly elected control plane starts from,
and what lets it adopt the replicas agents still run instead of starting them
again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from . import joins, snapshot
from .db import Conflict, Database, Row
from .errors import Taken


class NodeRow(msgspec.Struct, kw_only=True):
    """One node as stored."""

    id: str
    hostname: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    inventory: dict[str, Any] = msgspec.field(default_factory=dict)
    state: str = "ready"
    admin_state: str = "ready"
    reason: str = ""
    last_heartbeat: float = 0.0
    registered_at: float = 0.0


class ReplicaRow(msgspec.Struct, kw_only=True):
    """One replica as stored."""

    id: str
    model: str
    profile: str
    node: str
    gpus: list[str] = msgspec.field(default_factory=list)
    state: str = "pending"
    port: int | None = None
    restarts: int = 0
    reason: str = ""
    gpu_memory: int = 0
    cpu: float = 0.0
    memory: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0


class ModelRow(msgspec.Struct, kw_only=True):
    """A model added through the admin API: its definition as server.yaml would hold it."""

    name: str
    definition: dict[str, Any]
    added_at: float


# -- nodes -----------------------------------------------------------------------------


def _node(r: Row) -> NodeRow:
    return NodeRow(id=r["id"], hostname=r["hostname"], labels=json.loads(r["labels"]),
                   inventory=json.loads(r["inventory"]), state=r["state"],
                   admin_state=r["admin_state"], reason=r["reason"],
                   last_heartbeat=r["last_heartbeat"], registered_at=r["registered_at"])


async def list_nodes(db: Database) -> list[NodeRow]:
    """Every node, by id."""
    return [_node(r) for r in await db.fetch("SELECT * FROM nodes ORDER BY id")]


async def save_node(db: Database, n: NodeRow) -> None:
    """Inserts the node or replaces what its agent reports (hostname, labels, inventory,
    heartbeat); its recorded states are kept when it exists."""
    await db.execute(
        "INSERT INTO nodes (id, hostname, labels, inventory, state, admin_state, reason, "
        "last_heartbeat, registered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
        "ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, labels = excluded.labels, "
        "inventory = excluded.inventory, last_heartbeat = excluded.last_heartbeat",
        n.id, n.hostname, json.dumps(n.labels, sort_keys=True),
        json.dumps(n.inventory, sort_keys=True), n.state, n.admin_state, n.reason,
        n.last_heartbeat, n.registered_at)


async def set_node_state(db: Database, node: str, state: str, reason: str) -> None:
    """Records the state the control plane gave a node, and why."""
    await db.execute("UPDATE nodes SET state = $2, reason = $3 WHERE id = $1", node, state, reason)


async def set_admin_state(db: Database, node: str, admin_state: str) -> bool:
    """Records what an operator asked of a node; False when there is no such node."""
    n = await db.execute("UPDATE nodes SET admin_state = $2 WHERE id = $1", node, admin_state)
    return n > 0


async def touch_nodes(db: Database, heartbeats: Mapping[str, float]) -> None:
    """Records the last heartbeat of each node (batched: heartbeats are frequent)."""
    if heartbeats:
        await db.executemany("UPDATE nodes SET last_heartbeat = $2 WHERE id = $1",
                             sorted(heartbeats.items()))


async def delete_node(db: Database, node: str) -> None:
    """Removes a node and every replica row on it, and revokes its certificates: its agent
    cannot register it again without a new join token."""
    async with db.transaction() as tx:
        await tx.execute("DELETE FROM replicas WHERE node = $1", node)
        await tx.execute("DELETE FROM nodes WHERE id = $1", node)
        await joins.revoke_node(tx, node)


# -- models and scale ------------------------------------------------------------------


async def list_models(db: Database) -> list[ModelRow]:
    """Every model added through the admin API, by name."""
    rows = await db.fetch("SELECT * FROM models ORDER BY name")
    return [ModelRow(name=r["name"], definition=json.loads(r["definition"]), added_at=r["added_at"])
            for r in rows]


async def add_model(db: Database, name: str, definition: Mapping[str, Any],
                    now: float | None = None) -> ModelRow:
    """Stores a new model; Taken when one of that name is stored. Bumps the snapshot version
    (gateways list the catalog's models)."""
    now = time.time() if now is None else now
    try:
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO models (name, definition, added_at) VALUES ($1, $2, $3)",
                             name, json.dumps(definition, sort_keys=True), now)
            await snapshot.bump(tx)
    except Conflict as e:
        raise Taken("models.name_taken", f"model {name!r} exists already; remove it first "
                    f"(`llmgw ctl models remove {name}`) or choose another name", "name") from e
    return ModelRow(name=name, definition=dict(definition), added_at=now)


async def delete_model(db: Database, name: str) -> bool:
    """Removes a stored model and its scale; False when none of that name is stored."""
    async with db.transaction() as tx:
        n = await tx.execute("DELETE FROM models WHERE name = $1", name)
        await tx.execute("DELETE FROM model_scale WHERE model = $1", name)
        if n:
            await snapshot.bump(tx)
    return n > 0


async def scales(db: Database) -> dict[str, int]:
    """Model -> the replicas an operator set."""
    return {r["model"]: int(r["replicas"]) for r in await db.fetch("SELECT * FROM model_scale")}


async def set_scale(db: Database, model: str, replicas: int, now: float | None = None) -> None:
    """Records an operator's scale for a model."""
    now = time.time() if now is None else now
    await db.execute(
        "INSERT INTO model_scale (model, replicas, updated_at) VALUES ($1, $2, $3) "
        "ON CONFLICT (model) DO UPDATE SET replicas = excluded.replicas, "
        "updated_at = excluded.updated_at", model, replicas, now)


# -- replicas --------------------------------------------------------------------------


def _replica(r: Row) -> ReplicaRow:
    return ReplicaRow(id=r["id"], model=r["model"], profile=r["profile"], node=r["node"],
                      gpus=json.loads(r["gpus"]), state=r["state"],
                      port=None if r["port"] is None else int(r["port"]),
                      restarts=int(r["restarts"]), reason=r["reason"],
                      gpu_memory=int(r["gpu_memory"]), cpu=float(r["cpu"]),
                      memory=int(r["memory"]), created_at=r["created_at"],
                      updated_at=r["updated_at"])


async def list_replicas(db: Database) -> list[ReplicaRow]:
    """Every replica, stopped ones included, oldest first."""
    return [_replica(r) for r in await db.fetch("SELECT * FROM replicas ORDER BY created_at, id")]


async def insert_replica(db: Database, r: ReplicaRow) -> None:
    """Records a replica just placed."""
    await db.execute(
        "INSERT INTO replicas (id, model, profile, node, gpus, state, port, restarts, reason, "
        "gpu_memory, cpu, memory, created_at, updated_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        r.id, r.model, r.profile, r.node, json.dumps(r.gpus), r.state, r.port, r.restarts,
        r.reason, r.gpu_memory, r.cpu, r.memory, r.created_at, r.updated_at)


async def update_replica(db: Database, rid: str, *, state: str, port: int | None, restarts: int,
                         reason: str, now: float | None = None) -> None:
    """Records a replica's new state, port, restart count and reason."""
    now = time.time() if now is None else now
    await db.execute(
        "UPDATE replicas SET state = $2, port = $3, restarts = $4, reason = $5, updated_at = $6 "
        "WHERE id = $1", rid, state, port, restarts, reason, now)


async def prune_replicas(db: Database, before: float) -> int:
    """Forgets replicas stopped before `before`; returns how many."""
    rows = await db.fetch("SELECT id FROM replicas WHERE state = 'stopped' AND updated_at < $1",
                          before)
    ids = [r["id"] for r in rows]
    if ids:
        await db.executemany("DELETE FROM replicas WHERE id = $1", [(i,) for i in ids])
    return len(ids)
