"""The fleet's operator-facing requests: node states and removal, models, scale, restarts, logs.

`FleetOperations` is what the admin API (`llmgw.admin.fleet`) and a gateway's
wake call ask of the fleet: each checks the request, writes it through the
store under the fleet's lock and wakes the reconcile loop, which acts on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from llmgw.control import placement
from llmgw.control.catalog import Catalog, CatalogError, Model
from llmgw.control.fleet_state import FleetState
from llmgw.control.inventory import LIVE, AdminState, Node
from llmgw.store import fleet as rows
from llmgw.store.errors import Invalid, NotFound, Taken, shown

LOGS_WAIT = 5.0
"""How long `ctl nodes logs` waits for an agent's answer."""

ADMIN_STATES: dict[str, AdminState] = {"cordon": "cordoned", "drain": "draining", "ready": "ready"}
"""What an operator asks (`ctl nodes state N drain`) -> the node's admin state."""


class FleetOperations(FleetState):
    """What operators and gateways ask of the fleet."""

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
                        f"{node_id} drain`) and remove it once they moved, or once it is lost",
                        "id")
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
            raise Taken("models.name_taken", f"{e}; choose another name or alias", "name") from e
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

    async def restart(self, replica_ids: Sequence[str],
                      models: Sequence[str]) -> list[tuple[str, str]]:
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
