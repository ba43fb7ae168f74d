"""The fleet loop: from the catalog and agents' reports, replicas placed, started and stopped.

`Fleet` runs the reconciler: every `reconcile_every` seconds and after every
agent event it builds the desired state (server.yaml's models, the models
added through the admin API, operators' scale) and the observed one (nodes
and replicas, liveness from heartbeats), asks `reconciler.plan` for the
actions and carries them out: StartReplica and StopReplica on the nodes'
streams, states into the store, and the ready replicas into the gateways'
snapshot. `Fleet` is one object in three roles, each a module:

- `fleet_state`: the fleet in memory (loaded from the store at start, written
  through on every change) and what the others read of it;
- `fleet_agents`: what agents' streams report, folded into that state;
- `fleet_operators`: what operators and gateways ask (drain, scale, restart).

Agents talk to it through `llmgw.control.agents`, which turns the protocol's
messages into the plain values of `llmgw.control.reports` and gives each
stream an `AgentLink`; nothing here touches gRPC. Everything runs on the
control plane's one event loop; `_lock` keeps a pass and an agent's report
from interleaving around the store writes they both await.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from llmgw.control import reconciler
from llmgw.control.fleet_agents import FleetAgents
from llmgw.control.fleet_operators import FleetOperations
from llmgw.control.inventory import LIVE, Replica
from llmgw.control.periodic import run_periodically
from llmgw.protocol.wire import WakeReply
from llmgw.store import fleet as rows

log = logging.getLogger("llmgw.control.fleet")

PRUNE_EVERY = 60.0


class Fleet(FleetAgents, FleetOperations):
    """The fleet in memory and the loop that reconciles it; `cp.fleet`."""

    async def run(self) -> None:
        """Reconciles every `reconcile_every` seconds and whenever woken, forever."""
        await run_periodically(self._wake, self.settings.reconcile_every, self.reconcile,
                               "reconcile pass failed (%d in a row); the next one retries")

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

    async def _prune(self, now: float) -> None:
        before = now - self.settings.replica_retention
        old = [rid for rid, r in self.replicas.items()
               if r.state == "stopped" and self.updated_at.get(rid, 0) < before]
        if old:
            await rows.prune_replicas(self.db, before)
            for rid in old:
                self.replicas.pop(rid, None)
                self.updated_at.pop(rid, None)


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
