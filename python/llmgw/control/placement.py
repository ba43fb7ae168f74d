"""Placement: which node and GPUs a new replica goes to, and why a node cannot take one.

`Capacity` is the ledger of what every node has left, built once per reconcile
pass from the observed nodes and replicas and updated as replicas are placed.
A `PlacementPolicy` chooses within it; `BinPacking` is the default, and the
reconciler takes the policy as an argument so that quotas and measured
capacity can later change the choice without touching the reconciler.

Everything here is pure and deterministic: ties are broken by node id and GPU
index, so a test can pin where a replica goes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from llmgw.control.catalog import Model, Profile, fmt_bytes
from llmgw.control.inventory import LIVE, RESERVING, Gpu, Node, Replica

# Beyond this many GPU subsets to check for an NVLink-connected one, a greedy
# search is used instead; 8-GPU nodes never get near it (C(8,4) = 70).
_MAX_SUBSETS = 4096


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where one new replica goes."""

    node: str
    profile: str
    gpus: tuple[str, ...]
    """UUIDs, in index order."""
    gpu_indices: tuple[int, ...]
    nvlinked: bool = False
    """Its GPUs (two or more) are pairwise NVLink peers."""


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    """One finding about a node: a stable code and a sentence for the operator."""

    code: str
    message: str
    profile: str | None = None
    """The profile it is about; None when it is about the node as a whole."""


class NodeVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a node can take a replica of a model, and why (not)."""

    node: str
    ok: bool
    reasons: tuple[Reason, ...]

    @property
    def message(self) -> str:
        """The reasons as one paragraph."""
        return " ".join(r.message for r in self.reasons)


class Headroom(msgspec.Struct, frozen=True, kw_only=True):
    """How many more replicas of a model fit now, and where they would go."""

    model: str
    count: int
    placements: tuple[Placement, ...]

    @property
    def by_node(self) -> dict[str, int]:
        """Node id -> how many of them it would take."""
        return dict(sorted(Counter(p.node for p in self.placements).items()))


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


class PlacementPolicy(Protocol):
    """Chooses where a replica goes; the reconciler calls it and records the result."""

    def place(self, model: Model, capacity: Capacity) -> tuple[Profile, Placement] | None:
        """The profile and place for one more replica of `model`, or None when none fits."""
        ...

    def explain(self, model: Model, capacity: Capacity) -> list[NodeVerdict]:
        """For every node, in id order, whether it can take a replica of `model` and why."""
        ...


@dataclass(slots=True, frozen=True)
class Fit:
    """One node can take one replica: on these GPUs, leaving this much."""

    gpus: tuple[GpuCap, ...]
    nvlinked: bool
    leftover: int
    """What the node has left of the resource the profile uses most, after placing."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _gpu_summary(node: Node) -> str:
    counts = Counter(g.gpu_class for g in node.gpus)
    return " and ".join(f"{n} x {c}" for c, n in sorted(counts.items()))


_STATE_REASONS = {
    "cordoned": "is cordoned: it keeps its replicas but takes no new ones.",
    "draining": "is draining: its replicas are moving to other nodes.",
    "unreachable": "is unreachable: its agent has stopped reporting.",
    "lost": "is lost: its agent stopped reporting long enough that its replicas "
    "were placed elsewhere.",
}


def node_reason(node: Node) -> Reason | None:
    """Why a node takes no replica at all because of its state; None when it is ready."""
    text = _STATE_REASONS.get(node.state)
    if text is None:
        return None
    return Reason(code=f"placement.node_{node.state}", message=f"Node {node.id} {text}")


class BinPacking:
    """The default policy: the fullest node that fits, replicas of a model spread across nodes.

    Every ready node is checked for the first of the model's profiles it can
    take; among those that fit, the choice is by, in turn: fewest replicas of
    the model already there (spreading), the profile's rank, an NVLink-connected
    GPU set for a multi-GPU profile, least capacity left after placing (bin
    packing: the fullest node that fits), node id.
    """

    def place(self, model: Model, capacity: Capacity) -> tuple[Profile, Placement] | None:
        """See PlacementPolicy.place.

        A node without a replica of the model beats every node with one, so
        those are asked first, through one `FitIndex` per profile in rank order
        (a node in the index of profile r fits no earlier profile, or an earlier
        index would have answered). Only when none of them can take one are the
        nodes holding replicas compared, by the full key.
        """
        shapes = [_shape(p) for p in model.profiles]
        holding = capacity.holders.get(model.name, set())
        for rank, profile in enumerate(model.profiles):
            shape = shapes[rank]
            idx = capacity.index(shape, self._index_key(profile, shape),
                                 profile.gpu_class if profile.uses_gpus else None)
            found = idx.best(capacity.nodes, holding)
            if found is not None:
                fit = found.memo[shape]
                assert isinstance(fit, Fit)
                return profile, _placement(found, profile, fit)
        best: tuple[tuple[int, int, int, int, str], NodeCap, Profile, Fit] | None = None
        for nid in sorted(holding):
            nc = capacity.nodes[nid]
            got = self.first_fit(nc, model, shapes)
            if isinstance(got, list):
                continue
            rank, profile, fit = got
            # Spreading outranks the profile order: a second replica on a node that
            # already has one is a worse outcome than a less preferred profile.
            key = (
                nc.models[model.name],
                rank,
                0 if _linked_enough(profile, fit) else 1,
                fit.leftover,
                nc.node.id,
            )
            if best is None or key < best[0]:
                best = (key, nc, profile, fit)
        if best is None:
            return None
        _, nc, profile, fit = best
        return profile, _placement(nc, profile, fit)

    def _index_key(self, profile: Profile, shape: object
                   ) -> Callable[[NodeCap], tuple[object, ...] | None]:
        """A node's entry in the `FitIndex` of `profile`: the rest of `place`'s key."""
        def key(nc: NodeCap) -> tuple[object, ...] | None:
            fit = nc.memo.get(shape)
            if fit is None:
                fit = nc.memo[shape] = self.fit(nc, profile)
            if not isinstance(fit, Fit):
                return None
            return (0 if _linked_enough(profile, fit) else 1, fit.leftover)
        return key

    def explain(self, model: Model, capacity: Capacity) -> list[NodeVerdict]:
        """See PlacementPolicy.explain."""
        found = {nid: self.first_fit(nc, model) for nid, nc in capacity.nodes.items()}
        fewest = min(
            (
                capacity.nodes[n].models[model.name]
                for n, g in found.items()
                if isinstance(g, tuple)
            ),
            default=0,
        )
        out: list[NodeVerdict] = []
        for nid, got in found.items():
            if isinstance(got, list):
                out.append(NodeVerdict(node=nid, ok=False, reasons=tuple(got)))
                continue
            _, profile, fit = got
            held = capacity.nodes[nid].models[model.name]
            if held > fewest:
                msg = (
                    f"Node {nid} could take profile {profile.name} but already holds "
                    f"{_plural(held, 'replica')} of {model.name}, and other nodes that can "
                    f"take one hold fewer."
                )
                reason = Reason(code="placement.spreading", message=msg, profile=profile.name)
                out.append(NodeVerdict(node=nid, ok=False, reasons=(reason,)))
                continue
            msg = _fits_message(nid, model, profile, fit)
            reason = Reason(code="placement.fits", message=msg, profile=profile.name)
            out.append(NodeVerdict(node=nid, ok=True, reasons=(reason,)))
        return out

    def first_fit(
        self, nc: NodeCap, model: Model, shapes: Sequence[tuple[object, ...]] | None = None
    ) -> tuple[int, Profile, Fit] | list[Reason]:
        """The first of the model's profiles the node can take, or why it takes none.

        `shapes` are the profiles' `_shape`s, computed once by a caller that asks
        many nodes; results are kept in the node's memo under them.
        """
        if (r := node_reason(nc.node)) is not None:
            # The node's state rules out every profile; saying it once is enough.
            return [r]
        reasons: list[Reason] = []
        for rank, profile in enumerate(model.profiles):
            key = shapes[rank] if shapes is not None else _shape(profile)
            fit = nc.memo.get(key)
            if fit is None:
                fit = nc.memo[key] = self.fit(nc, profile)
            assert isinstance(fit, Fit | Reason)
            if isinstance(fit, Fit):
                return rank, profile, fit
            reasons.append(fit)
        return reasons

    def fit(self, nc: NodeCap, profile: Profile) -> Fit | Reason:
        """Whether one node can take one replica with `profile`; the first reason it cannot."""
        node = nc.node
        if (r := node_reason(node)) is not None:
            return r
        p = profile.name
        if node.engines and profile.engine not in node.engines:
            return Reason(
                code="placement.engine_unavailable",
                profile=p,
                message=(
                    f"Node {node.id} cannot run engine {profile.engine} for profile {p} "
                    f"(it runs {', '.join(sorted(node.engines))})."
                ),
            )
        for k, v in sorted(profile.node_labels.items()):
            if node.labels.get(k) != v:
                return Reason(
                    code="placement.label_missing",
                    profile=p,
                    message=(f"Node {node.id} lacks the label {k}={v} that profile {p} asks for."),
                )
        chosen: tuple[GpuCap, ...] = ()
        nvlinked = False
        if profile.uses_gpus:
            got = self._gpus(nc, profile)
            if isinstance(got, Reason):
                return got
            chosen, nvlinked = got
        if profile.cpu and nc.cpu_free + 1e-9 < profile.cpu:
            return Reason(
                code="placement.cpu",
                profile=p,
                message=(
                    f"Node {node.id} has {nc.cpu_free:g} CPU cores free, and profile {p} "
                    f"needs {profile.cpu:g}."
                ),
            )
        if profile.memory and nc.memory_free < profile.memory:
            return Reason(
                code="placement.memory",
                profile=p,
                message=(
                    f"Node {node.id} has {fmt_bytes(max(nc.memory_free, 0))} of memory free, "
                    f"and profile {p} needs {fmt_bytes(profile.memory)}."
                ),
            )
        if profile.uses_gpus:
            same = [c for c in nc.gpus if c.gpu.gpu_class == profile.gpu_class]
            leftover = sum(c.available for c in same) - profile.gpu_memory * len(chosen)
        else:
            leftover = nc.memory_free - profile.memory
        return Fit(chosen, nvlinked, leftover)

    def _gpus(self, nc: NodeCap, profile: Profile) -> tuple[tuple[GpuCap, ...], bool] | Reason:
        node, p, k, cls = nc.node, profile.name, profile.gpu_count, profile.gpu_class
        if not node.gpus:
            return Reason(
                code="placement.no_gpu",
                profile=p,
                message=(f"Node {node.id} has no GPU, and profile {p} needs {profile.describe()}."),
            )
        same = [c for c in nc.gpus if c.gpu.gpu_class == cls]
        if not same:
            return Reason(
                code="placement.wrong_gpu_class",
                profile=p,
                message=(
                    f"Node {node.id} has no {cls} GPU for profile {p} "
                    f"(it has {_gpu_summary(node)})."
                ),
            )
        if len(same) < k:
            return Reason(
                code="placement.too_few_gpus",
                profile=p,
                message=(
                    f"Node {node.id} has {_plural(len(same), f'{cls} GPU')}, and profile {p} "
                    f"needs {k}."
                ),
            )
        if profile.engine != "sim" and any(c.gpu.simulated for c in same):
            return Reason(
                code="placement.simulated_gpus",
                profile=p,
                message=(
                    f"Node {node.id} has simulated GPUs, which run only the sim engine, and "
                    f"profile {p} uses {profile.engine}."
                ),
            )
        need = profile.gpu_memory
        eligible = [c for c in same if c.available >= need]
        if len(eligible) < k:
            best = sorted((c.available for c in same), reverse=True)[:k]
            have = _join([fmt_bytes(b) for b in best])
            if k == 1:
                text = (
                    f"it needs {fmt_bytes(need)} free on 1 {cls} GPU, and its best has {have} free."
                )
            else:
                text = (
                    f"it needs {fmt_bytes(need)} free on each of {k} {cls} GPUs, and its best "
                    f"{k} have {have} free."
                )
            return Reason(
                code="placement.gpu_memory",
                profile=p,
                message=f"Node {node.id} lacks GPU memory for profile {p}: {text}",
            )
        # Best fit: the GPUs with the least room that still fit, so large holes stay
        # whole for large replicas.
        eligible.sort(key=lambda c: (c.available, c.gpu.index))
        if k == 1:
            return (eligible[0],), False
        if nc.links:
            linked = _linked_set(eligible, k, nc.links)
            if linked is not None:
                return linked, True
        if profile.nvlink == "require":
            return Reason(
                code="placement.no_nvlink_set",
                profile=p,
                message=(
                    f"Node {node.id} has no set of {k} {cls} GPUs that are pairwise "
                    f"NVLink-connected "
                    f"with {fmt_bytes(need)} free on each, and profile {p} requires NVLink."
                ),
            )
        return tuple(sorted(eligible[:k], key=lambda c: c.gpu.index)), False


def _placement(nc: NodeCap, profile: Profile, fit: Fit) -> Placement:
    return Placement(node=nc.node.id, profile=profile.name,
                     gpus=tuple(c.gpu.uuid for c in fit.gpus),
                     gpu_indices=tuple(c.gpu.index for c in fit.gpus), nvlinked=fit.nvlinked)


def _shape(p: Profile) -> tuple[object, ...]:
    """Everything about a profile that `BinPacking.fit` reads (the name is in its sentences)."""
    return (
        "binpacking",
        p.name,
        p.engine,
        p.gpu_class,
        p.gpu_count,
        p.gpu_memory,
        p.nvlink,
        p.cpu,
        p.memory,
        tuple(sorted(p.node_labels.items())),
    )


def _linked_enough(profile: Profile, fit: Fit) -> bool:
    return profile.gpu_count < 2 or fit.nvlinked


def _linked_set(
    eligible: list[GpuCap], k: int, links: dict[int, frozenset[int]]
) -> tuple[GpuCap, ...] | None:
    """The best-fitting k GPUs that are pairwise NVLink peers, or None."""

    def clique(cs: Sequence[GpuCap]) -> bool:
        return all(
            b.gpu.index in links.get(a.gpu.index, frozenset())
            for a, b in itertools.combinations(cs, 2)
        )

    # eligible is tightest first: if its first k are linked, no set fits tighter.
    # On NVSwitch nodes every set is linked, and this is the only check made.
    if clique(eligible[:k]):
        return tuple(sorted(eligible[:k], key=lambda c: c.gpu.index))
    if math.comb(len(eligible), k) <= _MAX_SUBSETS:
        best: tuple[tuple[int, tuple[int, ...]], tuple[GpuCap, ...]] | None = None
        for combo in itertools.combinations(eligible, k):
            if clique(combo):
                key = (sum(c.available for c in combo), tuple(sorted(c.gpu.index for c in combo)))
                if best is None or key < best[0]:
                    best = (key, combo)
        return None if best is None else tuple(sorted(best[1], key=lambda c: c.gpu.index))
    # Greedy on very large nodes: grow a set from each GPU, tightest first.
    for seed in eligible:
        group = [seed]
        for c in eligible:
            if c is not seed and all(c.gpu.index in links.get(g.gpu.index, ()) for g in group):
                group.append(c)
                if len(group) == k:
                    return tuple(sorted(group, key=lambda c: c.gpu.index))
    return None


def _join(items: Sequence[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _fits_message(nid: str, model: Model, profile: Profile, fit: Fit) -> str:
    if not fit.gpus:
        return (
            f"Node {nid} can take a replica of {model.name} with profile {profile.name} on its CPU."
        )
    idx = ", ".join(str(c.gpu.index) for c in fit.gpus)
    where = f"GPU {idx}" if len(fit.gpus) == 1 else f"GPUs {idx}"
    note = ""
    if len(fit.gpus) > 1:
        note = " (pairwise NVLink-connected)" if fit.nvlinked else " (not NVLink-connected)"
    return (
        f"Node {nid} can take a replica of {model.name} with profile {profile.name} "
        f"on {where}{note}."
    )


def explain(
    model: Model,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    policy: PlacementPolicy | None = None,
) -> list[NodeVerdict]:
    """For every node, in id order, whether it can take a replica of `model` now, and why (not)."""
    return (policy or BinPacking()).explain(model, Capacity(nodes, replicas))


def headroom(
    model: Model,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    limit: int,
    policy: PlacementPolicy | None = None,
) -> Headroom:
    """How many more replicas of `model` fit now (at most `limit`), and where each would go."""
    pol = policy or BinPacking()
    cap = Capacity(nodes, replicas)
    placed: list[Placement] = []
    while len(placed) < limit:
        got = pol.place(model, cap)
        if got is None:
            break
        profile, where = got
        cap.reserve(model.name, profile, where)
        placed.append(where)
    return Headroom(model=model.name, count=len(placed), placements=tuple(placed))
