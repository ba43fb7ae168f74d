"""Placement constraints: whether one node can take one replica of a profile, and why not.

`fit` checks a node against a profile in a fixed order (the node's state, its
engines, its labels, its GPUs: class, count, memory free and NVLink, then CPU
and memory) and returns the first `Reason` it cannot, a stable code and a
sentence for the operator, or the `Fit`: the GPUs it would use and what the
node has left. The policy (`llmgw.control.placement`) ranks
the fits; the sentences are what `llmgw ctl explain-placement` prints.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from llmgw.control.capacity import GpuCap, NodeCap
from llmgw.control.catalog import Model, Profile, fmt_bytes
from llmgw.control.inventory import Node

# Beyond this many GPU subsets to check for an NVLink-connected one, a greedy
# search is used instead; 8-GPU nodes never get near it (C(8,4) = 70).
_MAX_SUBSETS = 4096


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    """One finding about a node: a stable code and a sentence for the operator."""

    code: str
    message: str
    profile: str | None = None
    """The profile it is about; None when it is about the node as a whole."""


@dataclass(slots=True, frozen=True)
class Fit:
    """One node can take one replica: on these GPUs, leaving this much."""

    gpus: tuple[GpuCap, ...]
    nvlinked: bool
    leftover: int
    """What the node has left of the resource the profile uses most, after placing."""


def plural(n: int, word: str) -> str:
    """`n word`, with an s unless `n` is 1."""
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


def fit(nc: NodeCap, profile: Profile) -> Fit | Reason:
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
        got = _gpus(nc, profile)
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


def _gpus(nc: NodeCap, profile: Profile) -> tuple[tuple[GpuCap, ...], bool] | Reason:
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
                f"Node {node.id} has {plural(len(same), f'{cls} GPU')}, and profile {p} "
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


def fits_message(nid: str, model: Model, profile: Profile, fit: Fit) -> str:
    """The sentence saying that node `nid` can take a replica of `model`, and where."""
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
