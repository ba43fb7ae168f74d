"""The capacity ledger: what every node has left, and the nodes that fit each profile shape.

`Capacity` is built once per reconcile pass from the observed nodes and
replicas and updated as replicas are placed (`reserve`), so a placement
policy (`llmgw.control.placement`) always chooses in what is left. Its
`FitIndex`es keep, per profile shape, the nodes that can take one more
replica, best first, so a large pass does not ask every node per placement.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmgw.control.catalog import Profile
from llmgw.control.inventory import LIVE, RESERVING, Gpu, Node, Replica

if TYPE_CHECKING:
    from llmgw.control.placement import Placement


@dataclass(slots=True)
class GpuCap:
    """One GPU in the ledger: the report and what replicas hold on it."""

    gpu: Gpu
    reserved: int = 0

    @property
    def available(self) -> int:
        """Memory a new replica may take: the smaller of unreserved and free.

        Unreserved covers replicas placed but not yet started (the driver still
        shows their memory free); free covers processes that are not ours. A
        running replica shows in both, and taking the smaller counts it once.
        """
        return max(0, min(self.gpu.memory_total - self.reserved, self.gpu.memory_free))


@dataclass(slots=True)
class NodeCap:
    """One node in the ledger."""

    node: Node
    gpus: list[GpuCap]
    cpu_reserved: float = 0.0
    memory_reserved: int = 0
    models: Counter[str] = field(default_factory=Counter)
    """Model -> its replicas on the node that count for spreading."""
    links: dict[int, frozenset[int]] = field(default_factory=dict)
    """GPU index -> NVLink peers, made symmetric; empty when the node reports none."""
    memo: dict[object, object] = field(default_factory=dict)
    """What a policy worked out about this node; emptied whenever its holdings change.

    A first pass over a large fleet asks every node about every model's profiles,
    and most models share a few profile shapes: without this, the first pass over
    1,000 nodes took minutes."""
    version: int = 0
    """Counts changes of holdings: a `FitIndex` entry made before the last one is stale."""

    @property
    def cpu_free(self) -> float:
        """CPU cores not reserved by replicas."""
        return self.node.cpu_cores - self.cpu_reserved

    @property
    def memory_free(self) -> int:
        """Host memory not reserved by replicas."""
        return self.node.memory_bytes - self.memory_reserved


class FitIndex:
    """The nodes that can take one replica of one profile shape, best first.

    A heap of `(rank key..., node id, version)`: `push` adds a node's current
    entry; an entry whose version is older than its node's was made before the
    node's holdings changed and is dropped when it surfaces. Within a pass
    holdings only grow, so a node that cannot take the shape never can again
    until the next pass, and only the nodes in `fits` need a new entry when
    their holdings change (`Capacity._hold` does that). This turns "ask every
    node" per placement (900 placements x 1,000 nodes on a large first pass)
    into a heap lookup.
    """

    __slots__ = ("fits", "heap", "key")

    def __init__(self, key: Callable[[NodeCap], tuple[object, ...] | None]) -> None:
        self.heap: list[tuple[object, ...]] = []
        self.fits: set[str] = set()
        self.key = key
        """A node's place in the order (smaller is better), or None when it cannot take one."""

    def push(self, nc: NodeCap) -> None:
        """Adds the node's entry as it is now (or notes that it no longer fits)."""
        key = self.key(nc)
        if key is None:
            self.fits.discard(nc.node.id)
            return
        self.fits.add(nc.node.id)
        heapq.heappush(self.heap, (*key, nc.node.id, nc.version))

    def best(self, nodes: dict[str, NodeCap], skip: set[str]) -> NodeCap | None:
        """The best node not in `skip` that can take one, or None."""
        heap, aside, found = self.heap, [], None
        while heap:
            entry = heap[0]
            nid = entry[-2]
            assert isinstance(nid, str)
            nc = nodes[nid]
            if entry[-1] != nc.version:
                heapq.heappop(heap)
            elif nid in skip:
                aside.append(heapq.heappop(heap))
            else:
                found = nc
                break
        for e in aside:
            heapq.heappush(heap, e)
        return found


class Capacity:
    """What every node has left: the ledger a placement policy chooses in."""

    def __init__(self, nodes: Iterable[Node], replicas: Iterable[Replica]) -> None:
        """Builds the ledger; replicas in a reserving state hold their GPUs, CPU and memory."""
        self.nodes: dict[str, NodeCap] = {}
        self._by_uuid: dict[str, GpuCap] = {}
        self.holders: defaultdict[str, set[str]] = defaultdict(set)
        """Model -> the nodes with replicas of it that count for spreading."""
        self.indexes: dict[object, FitIndex] = {}
        """A policy's `FitIndex` per profile shape, made on first use in this pass."""
        for n in sorted(nodes, key=lambda n: n.id):
            caps = [GpuCap(g) for g in sorted(n.gpus, key=lambda g: g.index)]
            links: dict[int, set[int]] = {}
            for g in n.gpus:
                for p in g.nvlink_peers:
                    if p != g.index:
                        links.setdefault(g.index, set()).add(p)
                        links.setdefault(p, set()).add(g.index)
            self.nodes[n.id] = NodeCap(n, caps, links={k: frozenset(v) for k, v in links.items()})
            for c in caps:
                self._by_uuid[c.gpu.uuid] = c
        for r in replicas:
            self._hold(r.node, r.model, r.state, r.gpus, r.gpu_memory, r.cpu, r.memory)

    def index(self, shape: object, key: Callable[[NodeCap], tuple[object, ...] | None],
              gpu_class: str | None) -> FitIndex:
        """The `FitIndex` of a shape, made over the nodes that have `gpu_class` GPUs (every
        node when None) the first time it is asked for."""
        idx = self.indexes.get(shape)
        if idx is None:
            idx = self.indexes[shape] = FitIndex(key)
            for nc in self.nodes.values():
                if gpu_class is None or any(c.gpu.gpu_class == gpu_class for c in nc.gpus):
                    idx.push(nc)
        return idx

    def _hold(
        self,
        node: str,
        model: str,
        state: str,
        gpus: Sequence[str],
        gpu_memory: int,
        cpu: float,
        memory: int,
    ) -> None:
        nc = self.nodes.get(node)
        if nc is None or state not in RESERVING:
            return
        for u in gpus:
            c = self._by_uuid.get(u)
            if c is not None:
                c.reserved += gpu_memory
        nc.cpu_reserved += cpu
        nc.memory_reserved += memory
        nc.memo.clear()
        nc.version += 1
        if state in LIVE:
            nc.models[model] += 1
            self.holders[model].add(node)
        for idx in self.indexes.values():
            if node in idx.fits:
                idx.push(nc)

    def reserve(self, model: str, profile: Profile, placement: Placement) -> None:
        """Records a placement made in this pass, so the next one sees it."""
        self._hold(
            placement.node,
            model,
            "pending",
            placement.gpus,
            profile.gpu_memory,
            profile.cpu,
            profile.memory,
        )

    def gpu(self, uuid: str) -> GpuCap | None:
        """The ledger entry of a GPU, by UUID."""
        return self._by_uuid.get(uuid)

    def copy(self) -> Capacity:
        """An independent ledger with the same holdings (for what-if questions like headroom)."""
        new = Capacity.__new__(Capacity)
        new.nodes = {}
        new._by_uuid = {}
        new.holders = defaultdict(set, {m: set(ns) for m, ns in self.holders.items()})
        new.indexes = {}
        for nid, nc in self.nodes.items():
            caps = [GpuCap(c.gpu, c.reserved) for c in nc.gpus]
            new.nodes[nid] = NodeCap(
                nc.node, caps, nc.cpu_reserved, nc.memory_reserved, Counter(nc.models), nc.links
            )
            for c in caps:
                new._by_uuid[c.gpu.uuid] = c
        return new
