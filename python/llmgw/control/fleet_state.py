"""The fleet's state: nodes, replicas and the catalog in memory, written through to the store.

`FleetState` is loaded from the store at start (`load`); every change is
written through to it (`_set_replica`, `_stop`, `_publish` here, the others
where they are made), so a control plane that takes over finds the fleet as it
was. The reconcile loop (`llmgw.control.fleet`), the agents' reports
(`fleet_agents`) and the operators' requests (`fleet_operators`) all work on
this one state, and read here what they share of it: the desired and observed
states, the lookups that raise NotFound, and the gateways' snapshot part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from llmgw.config import url_host
from llmgw.control import placement, reconciler
from llmgw.control.catalog import Catalog, CatalogError, Model, Profile
from llmgw.control.inventory import Node, Observed, Replica
from llmgw.control.reports import AgentLink, NodeFacts
from llmgw.control.settings import Settings
from llmgw.engines.launch import engine_key
from llmgw.protocol.wire import ModelEntry, ReplicaEntry, Snapshot
from llmgw.store import Database
from llmgw.store import fleet as rows
from llmgw.store.errors import NotFound, shown
from llmgw.store.snapshot import bump

log = logging.getLogger("llmgw.control.fleet")


def node_of(row: rows.NodeRow, facts: NodeFacts) -> Node:
    """The inventory node of a stored row and its facts."""
    return Node(id=row.id, hostname=row.hostname, state=row.state,  # type: ignore[arg-type]
                admin_state=row.admin_state,  # type: ignore[arg-type]
                last_heartbeat=row.last_heartbeat, labels=dict(row.labels),
                gpus=tuple(facts.gpus), cpu_cores=facts.cpu_cores,
                memory_bytes=facts.memory_bytes, engines=tuple(facts.engines))


def replica_of(row: rows.ReplicaRow) -> Replica:
    """The inventory replica of a stored row."""
    return Replica(id=row.id, model=row.model, profile=row.profile, node=row.node,
                   gpus=tuple(row.gpus), state=row.state,  # type: ignore[arg-type]
                   port=row.port, restarts=row.restarts, reason=row.reason,
                   created_at=row.created_at, gpu_memory=row.gpu_memory, cpu=row.cpu,
                   memory=row.memory)


class FleetState:
    """The fleet in memory and every change to it; `Fleet` adds the loop and the handlers."""

    def __init__(self, db: Database, settings: Settings, models: Sequence[Model],
                 secret: bytes, poke: Any = None) -> None:
        self.db = db
        self.settings = settings
        self.policy = placement.BinPacking()
        self.timing = reconciler.Timing.of(settings)
        self.engine_key = engine_key(secret)
        self.poke = poke or (lambda: None)
        """Asks the snapshot publisher to rebuild now (`cp.snapshots.poke`)."""
        self.config_models = {m.name: m for m in models}
        self.runtime: dict[str, rows.ModelRow] = {}
        self.scale: dict[str, int] = {}
        self.awake: set[str] = set()
        """Models a gateway asked to wake (scale from zero)."""
        self.catalog = Catalog(list(models))
        self.nodes: dict[str, Node] = {}
        self.facts: dict[str, NodeFacts] = {}
        self.node_reason: dict[str, str] = {}
        self.registered_at: dict[str, float] = {}
        self.replicas: dict[str, Replica] = {}
        self.updated_at: dict[str, float] = {}
        self.pids: dict[str, int] = {}
        self.kv_ports: dict[str, tuple[int, int]] = {}
        """Replica -> its engine's KV-event and replay ports, as its agent reported them."""
        self.links: dict[str, AgentLink] = {}
        self.published: tuple[str, ...] = ()
        self.unplaced: dict[str, int] = {}
        self.passes = 0
        self._beats: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._logs: dict[str, list[asyncio.Future[list[str]]]] = {}
        self._pruned = 0.0
        self._orphans: dict[str, float] = {}
        self.started = time.time()
        self.awaiting: set[str] = set()
        """Nodes the store knows that have not registered with this control plane yet."""
        self.grace_until = 0.0
        """Until then, or until every node in `awaiting` is back, nothing is placed."""

    # -- start -------------------------------------------------------------------------

    async def load(self, now: float | None = None) -> None:
        """Reads nodes, replicas, runtime models and scale from the store.

        A node's silence while no control plane listened is not its fault: every node
        not already lost gets its heartbeat clock restarted now, so agents have the
        full `lost_after` to reconnect before their replicas are placed elsewhere
        (a failover must not move every replica). An unreachable one stays unreachable.

        Then nothing is placed until every node not lost has registered again, or for
        two heartbeat intervals at most (`settling`): a new leader after a failover, or
        a restarted control plane, learns from each agent's Register which replicas it
        runs and adopts them; placing before would start replicas a moment later found
        running, twice. Stops, liveness and adoption go on meanwhile.
        """
        now = time.time() if now is None else now
        for row in await rows.list_models(self.db):
            self.runtime[row.name] = row
        self.scale = await rows.scales(self.db)
        self._rebuild_catalog()
        for n in await rows.list_nodes(self.db):
            facts = msgspec.convert(n.inventory, NodeFacts)
            if n.state == "unreachable":
                n.last_heartbeat = now - self.settings.unreachable_after - 1
            elif n.state != "lost":
                n.last_heartbeat = now
            self.nodes[n.id] = node_of(n, facts)
            self.facts[n.id] = facts
            self.node_reason[n.id] = n.reason
            self.registered_at[n.id] = n.registered_at
        for r in await rows.list_replicas(self.db):
            self.replicas[r.id] = replica_of(r)
            self.updated_at[r.id] = r.updated_at
        self.published = tuple(sorted(r.id for r in self.replicas.values()
                                      if r.state == "ready" and r.model in self._names()))
        self.awaiting = {n.id for n in self.nodes.values() if n.state != "lost"}
        self.grace_until = now + 2 * self.settings.heartbeat_interval

    def settling(self, now: float) -> bool:
        """Whether placement waits: `placement_settle` after start, or the grace after load
        while some known node has not registered again."""
        if now < self.started + self.settings.placement_settle:
            return True
        return now < self.grace_until and bool(self.awaiting - self.links.keys())

    def _names(self) -> set[str]:
        return {m.name for m in self.catalog}

    def _rebuild_catalog(self) -> None:
        models = dict(self.config_models)
        for name, row in sorted(self.runtime.items()):
            try:
                m = msgspec.convert(row.definition, Model)
            except msgspec.ValidationError as e:
                log.error("model %s in the store is invalid (%s); it is left out", name, e)
                continue
            if name in models:
                log.warning("model %s is declared in server.yaml and was added through the admin "
                            "API; the server.yaml one is used", name)
                continue
            try:
                Catalog([*models.values(), m])
            except CatalogError as e:
                log.warning("model %s added through the admin API is left out: %s", name, e)
                continue
            models[name] = m
        self.catalog = Catalog(list(models.values()))

    # -- shared by the loop, the agents and the operators ------------------------------

    def wake(self) -> None:
        """Asks for a reconcile pass now rather than at the next tick."""
        self._wake.set()

    def wanted(self) -> list[reconciler.Want]:
        """The desired state: every catalog model and how many replicas of it."""
        return reconciler.wanted(self.catalog, self.scale, self.awake)

    def wanted_of(self, m: Model) -> int:
        """How many replicas of `m` the reconciler aims for now (scale, min..max, woken)."""
        [want] = reconciler.wanted([m], self.scale, self.awake)
        return want.replicas

    def observed(self) -> Observed:
        """The observed state now."""
        return Observed(nodes=tuple(self.nodes.values()), replicas=tuple(self.replicas.values()))

    def _spec(self, r: Replica) -> tuple[Model, Profile] | None:
        """The catalog's model and profile a replica runs; None when either is gone."""
        model = self.catalog.get(r.model)
        profile = model.profile(r.profile) if model else None
        return None if model is None or profile is None else (model, profile)

    async def _stop(self, rid: str, drain: bool, reason: str, now: float) -> None:
        r = self.replicas[rid]
        log.info("stopping %s on node %s: %s", rid, r.node, reason)
        await self._set_replica(rid, now, state="draining", reason=reason)
        link = self.links.get(r.node)
        if link is not None:
            link.stop(rid, self.settings.drain_timeout if drain else 0.0)

    async def _set_replica(self, rid: str, now: float, **changes: Any) -> None:
        r = self.replicas[rid]
        new = msgspec.structs.replace(r, **changes)
        if new == r:
            return
        self.replicas[rid] = new
        self.updated_at[rid] = now
        if new.state == "stopped":
            self.pids.pop(rid, None)
            self.kv_ports.pop(rid, None)
        await rows.update_replica(self.db, rid, state=new.state, port=new.port,
                                  restarts=new.restarts, reason=new.reason, now=now)

    async def _publish(self, ids: Sequence[str]) -> None:
        """Makes `ids` the replicas gateways route to; bumps the snapshot when that changed."""
        new = tuple(sorted(ids))
        if new == self.published:
            return
        log.info("routing to %d replica(s): %s", len(new), ", ".join(new) or "none")
        self.published = new
        async with self.db.transaction() as tx:
            await bump(tx)
        self.poke()

    # -- the snapshot ------------------------------------------------------------------

    def fill(self, snap: Snapshot) -> Snapshot:
        """Adds the catalog's models and the routed replicas to a gateways' snapshot."""
        snap.models = [ModelEntry(name=m.name, aliases=list(m.aliases),
                                  scale_from_zero=m.scale_from_zero,
                                  scale_up_timeout=m.scale_up_timeout) for m in self.catalog]
        out = []
        for rid in self.published:
            r = self.replicas.get(rid)
            url = self.url(r) if r is not None else None
            if r is None or url is None:
                continue
            events, replay = self.kv_ports.get(rid, (0, 0))
            host = self._host(r)
            out.append(ReplicaEntry(
                id=rid, model=r.model, url=url, engine_key=self.engine_key,
                kv_events=f"tcp://{host}:{events}" if events else None,
                kv_replay=f"tcp://{host}:{replay}" if replay else None))
        snap.replicas = out
        return snap

    def _host(self, r: Replica) -> str:
        """The address gateways reach the replica's node at (bracketed when IPv6)."""
        facts = self.facts.get(r.node)
        host = (facts.address if facts else "") or "127.0.0.1"
        return url_host(host)

    def url(self, r: Replica) -> str | None:
        """http://HOST:PORT of a replica's engine, or None before it has a port."""
        if r.port is None:
            return None
        return f"http://{self._host(r)}:{r.port}"

    # -- lookups -----------------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        """The node called `node_id`; NotFound otherwise."""
        n = self.nodes.get(node_id)
        if n is None:
            raise NotFound("nodes.not_found", f"there is no node {shown(node_id)}; list them "
                           "with `llmgw ctl nodes list`", "id")
        return n

    def model(self, name: str) -> Model:
        """The catalog model called `name` (or aliased so); NotFound otherwise."""
        m = self.catalog.get(name)
        if m is None:
            raise NotFound("models.not_found", f"there is no model {shown(name)}; list them with "
                           "`llmgw ctl models list`", "name")
        return m
