"""The fleet's agent-facing handlers: a stream registers, reports, disconnects, sends logs.

`FleetAgents` folds what an agent says (`llmgw.control.reports`, made by
`llmgw.control.agents` from the protocol) into the fleet's state: a node
registered, a replica it runs adopted or stopped, one it should run started
again, each status a heartbeat carries. A stream replaced by a newer one is
not heard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from llmgw.control.fleet_state import FleetState, node_of
from llmgw.control.reports import AgentLink, Registration, Status
from llmgw.store import fleet as rows

log = logging.getLogger("llmgw.control.fleet")

ORPHAN_RETRY = 10.0
"""Seconds before a replica an agent should not run is told to stop again."""


class FleetAgents(FleetState):
    """What agents' streams call on the fleet (`llmgw.control.agents`)."""

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
