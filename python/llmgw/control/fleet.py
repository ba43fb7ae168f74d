"""The fleet loop: from the catalog and what agents report, replicas placed, started, stopped and published.

`Fleet` holds the fleet in memory (loaded from the store at start, written
through on every change) and runs the reconciler: every `reconcile_every`
seconds and after every agent event it builds the desired state (server.yaml's
models, the models added through the admin API, operators' scale) and the
observed one (nodes and replicas, liveness from heartbeats), asks
`reconciler.plan` for the actions and carries them out: StartReplica and
StopReplica on the nodes' streams, states into the store, and the ready
replicas into the gateways' snapshot.

Agents talk to it through `llmgw.control.agents`, which turns the protocol's
messages into the plain values below and gives each stream an `AgentLink`;
nothing here touches gRPC. Everything runs on the control plane's one event
loop; `_lock` keeps a pass and an agent's report from interleaving around the
store writes they both await.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from llmgw.config import url_host
from llmgw.control import placement, reconciler
from llmgw.control.catalog import Catalog, CatalogError, Model, Profile
from llmgw.control.inventory import LIVE, AdminState, Gpu, Node, Observed, Replica, ReplicaState
from llmgw.control.periodic import run_periodically
from llmgw.control.settings import Settings
from llmgw.engines.launch import engine_key
from llmgw.protocol.wire import ModelEntry, ReplicaEntry, Snapshot, WakeReply
from llmgw.store import Database
from llmgw.store import fleet as rows
from llmgw.store.errors import Invalid, NotFound, Taken, shown
from llmgw.store.snapshot import bump

log = logging.getLogger("llmgw.control.fleet")

LOGS_WAIT = 5.0
"""How long `ctl nodes logs` waits for an agent's answer."""
PRUNE_EVERY = 60.0
ORPHAN_RETRY = 10.0
"""Seconds before a replica an agent should not run is told to stop again."""

ADMIN_STATES: dict[str, AdminState] = {"cordon": "cordoned", "drain": "draining", "ready": "ready"}
"""What an operator asks (`ctl nodes state N drain`) -> the node's admin state."""


class NodeFacts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What an agent says of its node beyond `Node`: kept in the store's inventory column."""

    gpus: list[Gpu] = msgspec.field(default_factory=list)
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    engines: list[str] = msgspec.field(default_factory=list)
    gpu_note: str = ""
    agent_version: str = ""
    boot_id: str = ""
    address: str = ""
    """Where gateways reach the node's engines: the agent's advertised address, else the
    address its stream came from."""


class Status(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's status as an agent reports it."""

    replica_id: str
    model: str
    state: ReplicaState
    port: int = 0
    pid: int = 0
    restarts: int = 0
    reason: str = ""
    kv_events_port: int = 0
    kv_replay_port: int = 0


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's first message on a stream: who it is and what it still runs."""

    node_id: str
    hostname: str
    labels: dict[str, str]
    facts: NodeFacts
    replicas: tuple[Status, ...] = ()


class AgentLink(Protocol):
    """The control plane's side of one agent's stream: the commands it can send."""

    node_id: str

    def start(self, replica: Replica, model: Model, profile: Profile, key: str) -> None:
        """Send StartReplica."""
        ...

    def stop(self, replica_id: str, drain_s: float) -> None:
        """Send StopReplica."""
        ...

    def request_logs(self, replica_id: str, lines: int) -> None:
        """Send RequestLogs; the answer comes back through `Fleet.logs_arrived`."""
        ...

    def close(self) -> None:
        """End the stream (the node was removed, or a newer stream replaced it)."""
        ...


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


class Fleet:
    """The fleet in memory and the loop that reconciles it; `cp.fleet`."""

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

    def wake(self) -> None:
        """Asks for a reconcile pass now rather than at the next tick."""
        self._wake.set()

    async def run(self) -> None:
        """Reconciles every `reconcile_every` seconds and whenever woken, forever."""
        await run_periodically(self._wake, self.settings.reconcile_every, self.reconcile,
                               "reconcile pass failed (%d in a row); the next one retries")

    # -- the pass ----------------------------------------------------------------------

    def wanted(self) -> list[reconciler.Want]:
        """The desired state: every catalog model and how many replicas of it."""
        return reconciler.wanted(self.catalog, self.scale, self.awake)

    def wanted_of(self, m: Model) -> int:
        """How many replicas of `m` the reconciler aims for now (scale, min..max, woken)."""
        [want] = reconciler.wanted([m], self.scale, self.awake)
        return want.replicas

    def wake_model(self, name: str) -> int:
        """Scale from zero: a gateway holds requests for a model with no ready replica, so it
        wants at least one (if it scales from zero). Returns the replicas it now wants.

        The model stays awake while this control plane runs; scaling back to zero after
        idleness is not built yet.
        """
        m = self.model(name)
        if not m.scale_from_zero:
            raise Invalid("models.no_scale_from_zero", f"model {m.name} does not scale from zero "
                          "(scale_from_zero: false); scale it up with `llmgw ctl models scale "
                          f"{m.name} 1`", "model")
        self.awake.add(m.name)
        self.wake()
        return self.wanted_of(m)

    def observed(self) -> Observed:
        """The observed state now."""
        return Observed(nodes=tuple(self.nodes.values()), replicas=tuple(self.replicas.values()))

    async def reconcile(self, now: float | None = None) -> list[reconciler.Action]:
        """One pass: plan, then carry out every action; returns them (for tests)."""
        async with self._lock:
            now = time.time() if now is None else now
            beats, self._beats = self._beats, {}
            await rows.touch_nodes(self.db, beats)
            wanted = self.wanted()
            if self.settling(now):
                # Settling: liveness and stops go on, but nothing is placed yet.
                wanted = [reconciler.Want(model=w.model, replicas=min(w.replicas, sum(
                    1 for r in self.replicas.values()
                    if r.model == w.model.name and r.state in LIVE))) for w in wanted]
            actions = reconciler.plan(wanted, self.observed(), now, self.policy, self.timing)
            publish = next(a for a in actions if isinstance(a, reconciler.Publish))
            if any(isinstance(a, reconciler.Unpublish) for a in actions):
                # Out of routing before the engines are told to drain, or gateways keep
                # sending requests to an engine that refuses them.
                await self._publish(publish.replicas)
            unplaced: dict[str, int] = {}
            for a in actions:
                if isinstance(a, reconciler.Unplaced):
                    unplaced[a.model] = a.missing
                else:
                    await self._do(a, now)
            for name, n in sorted(unplaced.items()):
                if self.unplaced.get(name) != n:
                    log.warning("%d replica(s) of %s cannot be placed; `llmgw ctl "
                                "explain-placement %s` says why on each node", n, name, name)
            self.unplaced = unplaced
            await self._publish(publish.replicas)
            if now - self._pruned > PRUNE_EVERY:
                self._pruned = now
                await self._prune(now)
            self.passes += 1
            return actions

    async def _do(self, a: reconciler.Action, now: float) -> None:
        if isinstance(a, reconciler.MarkNode):
            log.info("node %s is %s: %s", a.node, a.state, a.reason)
            self.nodes[a.node] = msgspec.structs.replace(self.nodes[a.node], state=a.state)
            self.node_reason[a.node] = a.reason
            await rows.set_node_state(self.db, a.node, a.state, a.reason)
        elif isinstance(a, reconciler.MarkReplica):
            await self._set_replica(a.replica, now, state=a.state, reason=a.reason)
        elif isinstance(a, reconciler.Start):
            await self._start(a.replica, now)
        elif isinstance(a, reconciler.Stop):
            await self._stop(a.replica, a.drain, a.reason, now)
        # Publish is done by the caller, once; Unpublish is in its set.

    def _spec(self, r: Replica) -> tuple[Model, Profile] | None:
        """The catalog's model and profile a replica runs; None when either is gone."""
        model = self.catalog.get(r.model)
        profile = model.profile(r.profile) if model else None
        return None if model is None or profile is None else (model, profile)

    async def _start(self, r: Replica, now: float) -> None:
        spec = self._spec(r)
        assert spec is not None  # plan placed it from the catalog
        model, profile = spec
        log.info("placing %s on node %s (profile %s, GPUs %s)", r.id, r.node, r.profile,
                 ", ".join(r.gpus) or "none")
        self.replicas[r.id] = r
        self.updated_at[r.id] = now
        await rows.insert_replica(self.db, rows.ReplicaRow(
            id=r.id, model=r.model, profile=r.profile, node=r.node, gpus=list(r.gpus),
            state=r.state, gpu_memory=r.gpu_memory, cpu=r.cpu, memory=r.memory, created_at=now,
            updated_at=now))
        link = self.links.get(r.node)
        if link is not None:  # else it is sent when the agent registers again
            link.start(r, model, profile, self.engine_key)

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

    async def _prune(self, now: float) -> None:
        before = now - self.settings.replica_retention
        old = [rid for rid, r in self.replicas.items()
               if r.state == "stopped" and self.updated_at.get(rid, 0) < before]
        if old:
            await rows.prune_replicas(self.db, before)
            for rid in old:
                self.replicas.pop(rid, None)
                self.updated_at.pop(rid, None)

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

    # -- agents ------------------------------------------------------------------------

    async def register(self, reg: Registration, link: AgentLink, now: float | None = None) -> None:
        """An agent opened a stream: records its node, adopts what it runs, repairs the rest.

        A replica it runs that this control plane stopped or never placed (a node back
        after it was lost, a store restored from backup) is stopped; one placed on it
        that it does not run (a Start lost with a cut stream) is started again.
        """
        now = time.time() if now is None else now
        async with self._lock:
            old = self.links.get(reg.node_id)
            if old is not None and old is not link:
                old.close()
            self.links[reg.node_id] = link
            self.awaiting.discard(reg.node_id)
            known = self.nodes.get(reg.node_id)
            row = rows.NodeRow(
                id=reg.node_id, hostname=reg.hostname, labels=dict(reg.labels),
                inventory=msgspec.to_builtins(reg.facts), state=known.state if known else "ready",
                admin_state=known.admin_state if known else "ready",
                last_heartbeat=now, registered_at=self.registered_at.get(reg.node_id, now))
            await rows.save_node(self.db, row)
            self.nodes[reg.node_id] = node_of(row, reg.facts)
            self.facts[reg.node_id] = reg.facts
            self.registered_at.setdefault(reg.node_id, now)
            self.node_reason.setdefault(reg.node_id, "registered")
            log.info("node %s registered (%d GPUs%s, %d replicas running)", reg.node_id,
                     len(reg.facts.gpus), ", simulated" if any(g.simulated for g in reg.facts.gpus)
                     else "", len(reg.replicas))
            running = {s.replica_id for s in reg.replicas}
            for s in reg.replicas:
                await self._observe(reg.node_id, s, link, now, registering=True)
            for r in list(self.replicas.values()):
                if r.node != reg.node_id or r.id in running:
                    continue
                if r.state in ("pending", "starting", "ready"):
                    if (spec := self._spec(r)) is not None:
                        log.info("node %s does not run %s: starting it again", r.node, r.id)
                        await self._set_replica(r.id, now, state="pending", port=None,
                                                reason="started again: its node did not run it")
                        link.start(self.replicas[r.id], *spec, self.engine_key)
                elif r.state == "draining":
                    await self._set_replica(r.id, now, state="stopped")
        self.wake()

    async def report(self, node_id: str, link: AgentLink, statuses: Sequence[Status],
                     heartbeat: bool, gpu_free: dict[str, int] | None = None) -> None:
        """A heartbeat (every replica's status) or one status change from `node_id`."""
        if self.links.get(node_id) is not link:
            return  # a stream replaced by a newer one: its last words are stale
        now = time.time()
        node = self.nodes.get(node_id)
        if node is None:
            return
        if heartbeat:
            changes: dict[str, Any] = {"last_heartbeat": now}
            if gpu_free:
                changes["gpus"] = tuple(
                    msgspec.structs.replace(g, memory_free=gpu_free[g.uuid])
                    if g.uuid in gpu_free and not g.simulated else g for g in node.gpus)
            self.nodes[node_id] = msgspec.structs.replace(node, **changes)
            self._beats[node_id] = now
        changed = False
        async with self._lock:
            for s in statuses:
                changed |= await self._observe(node_id, s, link, now)
        if changed:
            self.wake()

    async def _observe(self, node_id: str, s: Status, link: AgentLink, now: float,
                       registering: bool = False) -> bool:
        """Folds one reported status into the replica; True when something changed."""
        r = self.replicas.get(s.replica_id)
        if r is None or r.node != node_id or r.state == "stopped":
            # Told again only after a while: heartbeats repeat it until the agent is done.
            if s.state != "stopped" and now - self._orphans.get(s.replica_id, 0.0) > ORPHAN_RETRY:
                self._orphans[s.replica_id] = now
                log.warning("node %s runs %s, which is not placed there: stopping it", node_id,
                            s.replica_id)
                link.stop(s.replica_id, 0.0)
            return False
        if s.pid:
            self.pids[s.replica_id] = s.pid
        if s.kv_events_port:
            self.kv_ports[s.replica_id] = (s.kv_events_port, s.kv_replay_port)
        if r.state == "draining":
            # We asked it to stop: anything but "stopped" is from before the command.
            if s.state != "stopped":
                if registering:
                    # The stream that carried the Stop was cut before it arrived.
                    link.stop(r.id, self.settings.drain_timeout)
                return False
            await self._set_replica(r.id, now, state="stopped", port=None)
            return True
        reason = s.reason if s.state != "stopped" else (s.reason or "stopped by its agent")
        before = self.replicas[r.id]
        await self._set_replica(r.id, now, state=s.state, port=s.port or None,
                                restarts=s.restarts, reason=reason)
        return self.replicas[r.id] != before

    def disconnected(self, node_id: str, link: AgentLink) -> None:
        """A stream ended; the node's liveness now runs out with its heartbeats."""
        if self.links.get(node_id) is link:
            del self.links[node_id]
            log.info("node %s disconnected", node_id)

    def logs_arrived(self, replica_id: str, lines: list[str]) -> None:
        """An agent answered RequestLogs."""
        for fut in self._logs.pop(replica_id, []):
            if not fut.done():
                fut.set_result(lines)

    # -- operators ---------------------------------------------------------------------

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

    async def set_admin_state(self, node_id: str, want: str) -> Node:
        """cordon, drain or ready a node (what the next pass acts on)."""
        self.node(node_id)
        state = ADMIN_STATES.get(want)
        if state is None:
            raise Invalid("nodes.bad_state", f"state {shown(want)} is not one of cordon, drain, "
                          "ready", "state")
        async with self._lock:
            await rows.set_admin_state(self.db, node_id, state)
            self.nodes[node_id] = msgspec.structs.replace(self.nodes[node_id], admin_state=state)
        self.wake()
        return self.nodes[node_id]

    async def remove_node(self, node_id: str) -> Node:
        """Forgets a node that is lost or runs nothing; Taken otherwise."""
        n = self.node(node_id)
        live = [r.id for r in self.replicas.values() if r.node == node_id and r.state != "stopped"]
        if n.state != "lost" and live:
            raise Taken("nodes.not_empty", f"node {node_id} still has {len(live)} replica(s) "
                        f"({', '.join(sorted(live)[:5])}); drain it first (`llmgw ctl nodes state "
                        f"{node_id} drain`) and remove it once they moved, or once it is lost", "id")
        async with self._lock:
            await rows.delete_node(self.db, node_id)
            for rid in [r.id for r in self.replicas.values() if r.node == node_id]:
                del self.replicas[rid]
                self.updated_at.pop(rid, None)
                self.pids.pop(rid, None)
                self.kv_ports.pop(rid, None)
            self.nodes.pop(node_id, None)
            self.facts.pop(node_id, None)
            link = self.links.pop(node_id, None)
            if link is not None:
                link.close()
        self.wake()
        return n

    async def logs(self, node_id: str, source: str | None, lines: int) -> dict[str, list[str]]:
        """Replica id -> its engine's last `lines` output lines, from the node's agent.

        Raises TimeoutError when the agent is not connected or does not answer in time.
        """
        self.node(node_id)
        if source:
            r = self.replicas.get(source)
            if r is None or r.node != node_id:
                raise NotFound("nodes.no_such_source", f"node {node_id} has no replica "
                               f"{shown(source)}; `llmgw ctl replicas` lists where each runs",
                               "source")
            ids = [source]
        else:
            ids = sorted(r.id for r in self.replicas.values()
                         if r.node == node_id and r.state != "stopped")
        link = self.links.get(node_id)
        if link is None:
            raise TimeoutError(f"node {node_id} is not connected; its agent keeps the logs")
        loop = asyncio.get_running_loop()
        futs = {}
        for rid in ids:
            fut: asyncio.Future[list[str]] = loop.create_future()
            self._logs.setdefault(rid, []).append(fut)
            futs[rid] = fut
            link.request_logs(rid, lines)
        try:
            async with asyncio.timeout(LOGS_WAIT):
                return {rid: await f for rid, f in futs.items()}
        except TimeoutError:
            raise TimeoutError(f"the agent of node {node_id} did not send the logs within "
                               f"{LOGS_WAIT:g} s") from None
        finally:
            for rid, f in futs.items():
                waiting = self._logs.get(rid, [])
                if f in waiting:
                    waiting.remove(f)

    async def add_model(self, m: Model, definition: dict[str, Any]) -> Model:
        """Adds a model to the catalog (kept in the store); Taken when a name is used."""
        try:
            Catalog([*self.catalog, m])
        except CatalogError as e:
            raise Taken("models.name_taken", f"{e} Choose another name or alias.", "name") from e
        async with self._lock:
            self.runtime[m.name] = await rows.add_model(self.db, m.name, definition)
            self._rebuild_catalog()
        self.poke()
        self.wake()
        return m

    async def remove_model(self, name: str) -> Model:
        """Removes a model added through the admin API; its replicas are stopped."""
        m = self.model(name)
        if m.name in self.config_models:
            raise Taken("models.in_config", f"model {m.name} is declared in server.yaml; remove it "
                        "there and restart the control plane", "name")
        async with self._lock:
            await rows.delete_model(self.db, m.name)
            self.runtime.pop(m.name, None)
            self.scale.pop(m.name, None)
            self._rebuild_catalog()
        self.poke()
        self.wake()
        return m

    async def set_scale(self, name: str, replicas: int) -> Model:
        """Sets how many replicas of a model run, within its min..max."""
        m = self.model(name)
        if not m.min_replicas <= replicas <= m.ceiling:
            raise Invalid("models.bad_scale", f"model {m.name} takes {m.min_replicas} to "
                          f"{m.ceiling} replicas, not {replicas}; change its min_replicas or "
                          "max_replicas to go beyond", "replicas")
        async with self._lock:
            await rows.set_scale(self.db, m.name, replicas)
            self.scale[m.name] = replicas
        self.wake()
        return m

    def explain(self, name: str) -> list[placement.NodeVerdict]:
        """For every node, whether it can take one more replica of the model, and why."""
        return placement.explain(self.model(name), self.nodes.values(), self.replicas.values(),
                                 self.policy)

    def headroom(self, name: str, limit: int) -> placement.Headroom:
        """How many more replicas of the model fit now, and where."""
        return placement.headroom(self.model(name), self.nodes.values(), self.replicas.values(),
                                  limit, self.policy)

    async def restart(self, replica_ids: Sequence[str], models: Sequence[str]) -> list[tuple[str, str]]:
        """Restarts replicas: a parked one in place (its failures forgotten), any other by
        draining it while the next pass places a fresh one. Returns (replica, how)."""
        chosen: list[str] = []
        for rid in replica_ids:
            if rid not in self.replicas:
                raise NotFound("replicas.not_found", f"there is no replica {shown(rid)}; "
                               "`llmgw ctl replicas` lists them", "replicas")
            chosen.append(rid)
        for name in models:
            m = self.model(name)
            chosen += sorted(r.id for r in self.replicas.values()
                             if r.model == m.name and r.state != "stopped")
        done: list[tuple[str, str]] = []
        now = time.time()
        async with self._lock:
            for rid in dict.fromkeys(chosen):
                r = self.replicas[rid]
                link = self.links.get(r.node)
                spec = self._spec(r)
                if r.state == "parked" and link is not None and spec is not None:
                    await self._set_replica(rid, now, state="pending",
                                            reason="restarted by an operator")
                    link.start(self.replicas[rid], *spec, self.engine_key)
                    done.append((rid, "started again in place"))
                elif r.state in LIVE:
                    await self._publish([p for p in self.published if p != rid])
                    await self._stop(rid, r.state == "ready", "restarted by an operator", now)
                    done.append((rid, "draining; a new replica takes its place"))
        self.wake()
        return done


async def attach(cp: Any) -> None:
    """Control plane part (see `llmgw.control.server.ATTACH`): `cp.fleet`, its loop, and the
    fleet's models and replicas in the gateways' snapshot. The agent service hands streams
    to `cp.fleet` while it is set (`llmgw.control.agents`)."""

    snapshots = cp.snapshots
    # Fenced: a write made after another control plane took the lease fails (and steps
    # this one down) instead of overwriting the new leader's fleet.
    db = cp.leadership.fence(cp.db) if cp.leadership is not None else cp.db
    fleet = Fleet(db, cp.settings, cp.config.models, cp.secret,
                  poke=snapshots.poke if snapshots is not None else None)
    await fleet.load()
    cp.fleet = fleet
    if snapshots is not None:
        snapshots.add_part(fleet.fill)
        snapshots.poke()

    async def wake(model: str) -> WakeReply:
        # NotFound/Invalid go up as they are: the admin route maps them (store_errors).
        return WakeReply(model=model, replicas=fleet.wake_model(model))

    cp.wake = wake  # POST /internal/v1/wake
    cp.spawn(fleet.run(), "fleet")

    async def stop() -> None:
        # Fencing: a control plane that stops leading must not keep agents either; their
        # streams end here and the agents go to whoever leads now.
        for link in list(fleet.links.values()):
            link.close()
        fleet.links.clear()

    cp.on_stop(stop)
