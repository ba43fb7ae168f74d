"""What agents report and what the fleet sends back, as plain values: no protobuf, no gRPC.

`llmgw.control.agents` turns each protocol message into one of these
(`Registration` when a stream opens, `Status` for each replica a heartbeat or
a change carries, `NodeFacts` for what the node is) and gives each stream an
`AgentLink`, the commands the fleet may send on it.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from llmgw.control.catalog import Model, Profile
from llmgw.control.inventory import Gpu, Replica, ReplicaState


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
