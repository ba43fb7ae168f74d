"""Observed state: the nodes agents report and the replicas placed on them.

These are plain values, built by the wiring from the store and the agents'
reports; placement and the reconciler only read them. A node's `state` is what
the control plane last recorded; `admin_state` is what an operator asked for
(cordon, drain, ready), kept apart so that a node that is cordoned, goes
unreachable and comes back is cordoned again rather than silently ready.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

NodeState = Literal["ready", "cordoned", "draining", "unreachable", "lost"]
AdminState = Literal["ready", "cordoned", "draining"]
ReplicaState = Literal["pending", "starting", "ready", "draining", "stopped", "parked"]

LIVE: frozenset[ReplicaState] = frozenset({"pending", "starting", "ready", "parked"})
"""Replicas that count towards a model's wanted number (and are spread across nodes)."""
RESERVING: frozenset[ReplicaState] = frozenset(
    {"pending", "starting", "ready", "draining", "parked"}
)
"""Replica states that hold their GPUs' memory. Parked ones keep it, so a retry finds its GPUs."""


class Gpu(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU as its agent reports it."""

    uuid: str
    index: int
    model: str
    """The name the driver gives (`NVIDIA H100 80GB HBM3`)."""
    gpu_class: str
    """What profiles ask for (`H100-80GB`); the agent derives it with `gpu_class_of`."""
    memory_total: int
    memory_free: int
    """Free as the driver last said, including what other processes use."""
    nvlink_peers: tuple[int, ...] = ()
    """Indices of GPUs on the same node this one reaches over NVLink."""
    simulated: bool = False


class Node(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One node: its GPUs and resources, what it can run, and its state."""

    id: str
    hostname: str
    state: NodeState = "ready"
    admin_state: AdminState = "ready"
    last_heartbeat: float = 0.0
    """Unix seconds of the last report from its agent."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    engines: tuple[str, ...] = ()
    """Engines its agent can start; empty means the agent did not say, and any is tried."""

    @property
    def simulated(self) -> bool:
        """Whether it has GPUs and they are all simulated."""
        return bool(self.gpus) and all(g.simulated for g in self.gpus)


class Replica(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One replica of a model: where it was placed and how it is doing."""

    id: str
    model: str
    profile: str
    node: str
    gpus: tuple[str, ...] = ()
    """UUIDs of its GPUs, all on `node`."""
    state: ReplicaState = "pending"
    port: int | None = None
    restarts: int = 0
    reason: str = ""
    """Why it is in its state, when that needs saying (parked, stopped by a lost node)."""
    created_at: float = 0.0
    gpu_memory: int = 0
    """Memory it holds on each of its GPUs: its profile's, as it was when it was placed."""
    cpu: float = 0.0
    memory: int = 0
    """CPU cores and host memory it holds on its node."""


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    """What the control plane knows of the fleet at one moment."""

    nodes: tuple[Node, ...] = ()
    replicas: tuple[Replica, ...] = ()


# Marketed memory sizes in GiB. The driver reports a little less than the label
# (an H100 80GB has 79.6 GiB, an L4 22.5 GiB), so the class takes the smallest
# label the reported size reaches within a few percent.
_SIZES_GIB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 144, 180, 192, 288)
_PRODUCT = re.compile(r"\b([A-Z]{1,4}\d{1,4}[A-Za-z]{0,3}|RTX\s?\d{4}(?:\s?Ti)?)\b")


def gpu_class_of(name: str, memory_total: int) -> str:
    """The class profiles ask for, from the driver's name and memory: `H100-80GB`, `L4-24GB`."""
    gib = memory_total / 2**30
    size = next((s for s in _SIZES_GIB if gib >= s * 0.9 and gib <= s * 1.02), round(gib))
    found = _PRODUCT.findall(name.replace("NVIDIA", ""))
    product = found[0].replace(" ", "") if found else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
    return f"{product}-{size}GB"
