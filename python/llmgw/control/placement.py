"""Placement policy: which node and GPUs a new replica goes to, and why a node takes none.

A `PlacementPolicy` chooses in the capacity ledger (`llmgw.control.capacity`),
built once per reconcile pass; `BinPacking` is the default, and the reconciler
takes the policy as an argument so that quotas and measured capacity can later
change the choice without touching the reconciler. Whether one node can take
one profile at all, and the sentence saying why not, is `llmgw.control.constraints`;
here the nodes that can are ranked, and `explain` and `headroom` answer the
operator's what-if questions.

Everything here is pure and deterministic: ties are broken by node id and GPU
index, so a test can pin where a replica goes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import msgspec

from llmgw.control import constraints
from llmgw.control.capacity import Capacity, NodeCap
from llmgw.control.catalog import Model, Profile
from llmgw.control.constraints import Fit, Reason, fits_message, node_reason, plural
from llmgw.control.inventory import Node, Replica


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where one new replica goes."""

    node: str
    profile: str
    gpus: tuple[str, ...]
    """UUIDs, in index order."""
    gpu_indices: tuple[int, ...]
    nvlinked: bool = False
    """Its GPUs (two or more) are pairwise NVLink peers."""


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


class PlacementPolicy(Protocol):
    """Chooses where a replica goes; the reconciler calls it and records the result."""

    def place(self, model: Model, capacity: Capacity) -> tuple[Profile, Placement] | None:
        """The profile and place for one more replica of `model`, or None when none fits."""
        ...

    def explain(self, model: Model, capacity: Capacity) -> list[NodeVerdict]:
        """For every node, in id order, whether it can take a replica of `model` and why."""
        ...


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
                fit = nc.memo[shape] = constraints.fit(nc, profile)
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
                    f"{plural(held, 'replica')} of {model.name}, and other nodes that can "
                    f"take one hold fewer."
                )
                reason = Reason(code="placement.spreading", message=msg, profile=profile.name)
                out.append(NodeVerdict(node=nid, ok=False, reasons=(reason,)))
                continue
            msg = fits_message(nid, model, profile, fit)
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
                fit = nc.memo[key] = constraints.fit(nc, profile)
            assert isinstance(fit, Fit | Reason)
            if isinstance(fit, Fit):
                return rank, profile, fit
            reasons.append(fit)
        return reasons


def _placement(nc: NodeCap, profile: Profile, fit: Fit) -> Placement:
    return Placement(node=nc.node.id, profile=profile.name,
                     gpus=tuple(c.gpu.uuid for c in fit.gpus),
                     gpu_indices=tuple(c.gpu.index for c in fit.gpus), nvlinked=fit.nvlinked)


def _shape(p: Profile) -> tuple[object, ...]:
    """Everything about a profile that `constraints.fit` reads (the name is in its sentences)."""
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
