"""Conversions between the agent's own types and the llmgw.v1 messages."""

from __future__ import annotations

from llmgw.agent.inventory import GpuInfo, GpuSample, HostFacts, Inventory
from llmgw.agent.supervisor import ReplicaInfo, State
from llmgw.engines.launch import LaunchRequest
from llmgw.v1 import agent_pb2 as pb

STATES: dict[State, pb.ReplicaState.ValueType] = {
    "pending": pb.REPLICA_STATE_PENDING,
    "starting": pb.REPLICA_STATE_STARTING,
    "ready": pb.REPLICA_STATE_READY,
    "draining": pb.REPLICA_STATE_DRAINING,
    "stopped": pb.REPLICA_STATE_STOPPED,
    "parked": pb.REPLICA_STATE_PARKED,
}
STATE_NAMES: dict[int, State] = {v: k for k, v in STATES.items()}


def replica_status(info: ReplicaInfo) -> pb.ReplicaStatus:
    """The wire form of one replica's status."""
    return pb.ReplicaStatus(
        replica_id=info.replica_id, model=info.model, state=STATES[info.state], port=info.port,
        engine_pid=info.pid, restarts=info.restarts, reason=info.reason, engine=info.engine,
        gpu_uuids=list(info.gpu_uuids), kv_events_port=info.kv_events_port,
        kv_replay_port=info.kv_replay_port,
    )  # fmt: skip


def gpu(g: GpuInfo) -> pb.Gpu:
    """The wire form of one GPU."""
    return pb.Gpu(
        uuid=g.uuid, index=g.index, model=g.model, memory_total_bytes=g.memory_total_bytes,
        memory_free_bytes=g.memory_free_bytes, nvlink_peers=list(g.nvlink_peers),
        simulated=g.simulated, pci_bus_id=g.pci_bus_id,
    )  # fmt: skip


def gpu_load(s: GpuSample) -> pb.GpuLoad:
    """The wire form of one GPU's load."""
    return pb.GpuLoad(uuid=s.uuid, utilization_percent=s.utilization_percent,
                      memory_used_bytes=s.memory_used_bytes, memory_free_bytes=s.memory_free_bytes)  # fmt: skip


def register(*, node_id: str, host: HostFacts, inventory: Inventory, labels: dict[str, str],
             engines: list[tuple[str, str]], version: str, boot_id: str, advertise_address: str,
             replicas: list[ReplicaInfo]) -> pb.Register:  # fmt: skip
    """The registration an agent opens every stream with."""
    return pb.Register(
        node_id=node_id, hostname=host.hostname, labels=labels, gpus=[gpu(g) for g in inventory.gpus],
        cpu_count=host.cpu_count, memory_bytes=host.memory_bytes,
        engines=[pb.EngineInfo(name=n, version=v) for n, v in engines], agent_version=version,
        replicas=[replica_status(r) for r in replicas], gpu_note=inventory.note, boot_id=boot_id,
        advertise_address=advertise_address,
    )  # fmt: skip


def launch_request(m: pb.StartReplica, simulated_gpus: bool) -> LaunchRequest:
    """The supervisor's form of a StartReplica command."""
    return LaunchRequest(
        replica_id=m.replica_id, model=m.model, engine=m.engine, port=m.port, host="", args=tuple(m.args),
        env=dict(m.env), gpu_uuids=tuple(m.gpu_uuids), simulated_gpus=simulated_gpus,
        engine_key=m.engine_key, source=m.source,
    )  # fmt: skip
