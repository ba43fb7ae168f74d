"""The reconciler: from the desired and the observed state, the actions that close the gap.

Level-triggered: `plan` looks only at the state it is given, never at what it
did last time, so a lost event or a restarted control plane costs nothing but
one more pass. It is pure and deterministic (every iteration is over an
explicit sort order), and it never places twice: what it starts is in the
observed state of the next pass as a pending replica, and `apply` is the model
of exactly that, which the store-backed wiring must follow.

A pass, in order:
1. node liveness and operator states (MarkNode);
2. replicas on lost or vanished nodes marked stopped (MarkReplica), so they are
   placed again in the same pass;
3. per model: replicas the catalog no longer has stopped; replicas on draining
   nodes replaced first and stopped once enough others are ready; surplus
   stopped, the least useful first; missing ones placed by the policy, one
   replica per model per round so that one large model cannot starve the rest;
4. the ready replicas to route to (Publish).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from llmgw.control.capacity import Capacity
from llmgw.control.catalog import Model
from llmgw.control.inventory import LIVE, Node, NodeState, Observed, Replica, ReplicaState
from llmgw.control.placement import BinPacking, PlacementPolicy
from llmgw.control.settings import Settings as ControlSettings


class Timing(msgspec.Struct, frozen=True, kw_only=True):
    """When a silent node is unreachable and when it is lost: the part of the control
    plane's `Settings` (`control_plane:` in server.yaml) a pass reads.

    A view, not a second source: the defaults, the docs and the check that
    `lost_after` is the longer live in `llmgw.control.settings.Settings` only,
    and `Timing.of` builds this from it.
    """

    unreachable_after: float
    lost_after: float

    @classmethod
    def of(cls, settings: ControlSettings) -> Timing:
        """The timing of the control plane's settings."""
        return cls(unreachable_after=settings.unreachable_after, lost_after=settings.lost_after)


class Want(msgspec.Struct, frozen=True, kw_only=True):
    """A model and how many replicas of it should run."""

    model: Model
    replicas: int


# -- actions ---------------------------------------------------------------


class Start(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """Tell the replica's node to start it; the replica is recorded pending."""

    replica: Replica

    @property
    def node(self) -> str:
        """The node to tell."""
        return self.replica.node

    @property
    def gpus(self) -> tuple[str, ...]:
        """The UUIDs of the GPUs it gets."""
        return self.replica.gpus


class Stop(msgspec.Struct, frozen=True, kw_only=True, tag="stop"):
    """Tell a node to stop a replica: with `drain`, after its requests in flight finish."""

    replica: str
    node: str
    drain: bool
    reason: str


class MarkNode(msgspec.Struct, frozen=True, kw_only=True, tag="mark_node"):
    """Record a node's new state."""

    node: str
    state: NodeState
    reason: str


class MarkReplica(msgspec.Struct, frozen=True, kw_only=True, tag="mark_replica"):
    """Record a replica's new state without telling its node (which cannot be reached)."""

    replica: str
    state: ReplicaState
    reason: str


class Unpublish(msgspec.Struct, frozen=True, kw_only=True, tag="unpublish"):
    """Take a replica out of routing; comes before the Stop that drains it."""

    replica: str


class Publish(msgspec.Struct, frozen=True, kw_only=True, tag="publish"):
    """The whole set of replicas gateways should route to, by id; the last action of a pass."""

    replicas: tuple[str, ...]


class Unplaced(msgspec.Struct, frozen=True, kw_only=True, tag="unplaced"):
    """Replicas of a model that no node can take now; `explain` says why on each node."""

    model: str
    missing: int


Action = Start | Stop | MarkNode | MarkReplica | Unpublish | Publish | Unplaced


# -- desired state ---------------------------------------------------------


def wanted(
    models: Iterable[Model],
    scale: Mapping[str, int] | None = None,
    awake: Iterable[str] = (),
) -> list[Want]:
    """How many replicas of each model: an explicit scale (held to min..max) or min_replicas.

    A model in `awake` (asked for by a request while it had no ready replica)
    wants at least one, if it scales from zero.
    """
    scale = scale or {}
    woken = set(awake)
    out = []
    for m in sorted(models, key=lambda m: m.name):
        w = Want(model=m, replicas=m.clamp(scale.get(m.name, m.min_replicas)))
        out.append(wake(w) if m.name in woken else w)
    return out


def wake(want: Want) -> Want:
    """Scale from zero: at least one replica, if the model allows it."""
    if not want.model.scale_from_zero or want.replicas >= 1:
        return want
    return Want(model=want.model, replicas=min(1, want.model.ceiling))


# -- the pass --------------------------------------------------------------

# Which surplus replica to stop first: the one doing least (parked, then not yet
# started), then the newest, so long-running warm replicas survive a scale-down.
_STOP_RANK: dict[str, int] = {"parked": 0, "pending": 1, "starting": 2, "ready": 3}


def node_state(node: Node, now: float, settings: Timing) -> tuple[NodeState, str]:
    """The state a node should be in now, and why, from its heartbeat and its operator state."""
    silent = now - node.last_heartbeat
    if silent > settings.lost_after:
        return "lost", f"no heartbeat for {silent:.0f} s (lost after {settings.lost_after:g} s)"
    if silent > settings.unreachable_after:
        return "unreachable", (
            f"no heartbeat for {silent:.0f} s (unreachable after {settings.unreachable_after:g} s)"
        )
    if node.state in ("unreachable", "lost"):
        return node.admin_state, "heartbeats again"
    return node.admin_state, f"set {node.admin_state} by an operator"


def plan(
    desired: Sequence[Want],
    observed: Observed,
    now: float,
    policy: PlacementPolicy | None = None,
    settings: Timing | None = None,
) -> list[Action]:
    """The actions that move `observed` towards `desired`; see the module docstring.

    `settings` defaults to the timing of a default `control.settings.Settings`."""
    policy = policy or BinPacking()
    settings = settings or Timing.of(ControlSettings())
    actions: list[Action] = []

    nodes: dict[str, Node] = {}
    for n in sorted(observed.nodes, key=lambda n: n.id):
        state, why = node_state(n, now, settings)
        if state != n.state:
            actions.append(MarkNode(node=n.id, state=state, reason=why))
            n = msgspec.structs.replace(n, state=state)
        nodes[n.id] = n

    replicas = sorted(observed.replicas, key=lambda r: (r.model, r.created_at, r.id))
    kept: list[Replica] = []
    for r in replicas:
        node = nodes.get(r.node)
        if r.state != "stopped" and (node is None or node.state == "lost"):
            why = f"node {r.node} was lost" if node else f"node {r.node} was removed"
            if r.state == "ready":
                actions.append(Unpublish(replica=r.id))
            actions.append(MarkReplica(replica=r.id, state="stopped", reason=why))
            r = msgspec.structs.replace(r, state="stopped", reason=why)
        kept.append(r)

    capacity = Capacity(nodes.values(), kept)
    by_model: dict[str, list[Replica]] = defaultdict(list)
    for r in kept:
        by_model[r.model].append(r)
    stopping: set[str] = set()
    missing: dict[str, int] = {}
    wants = {w.model.name: w for w in desired}

    for name in sorted(set(by_model) | set(wants)):
        want = wants.get(name)
        live = [r for r in by_model.get(name, []) if r.state in LIVE]
        if want is None:
            _stop_all(live, f"model {name} is no longer in the catalog", actions, stopping)
            continue
        gone = [r for r in live if want.model.profile(r.profile) is None]
        _stop_all(gone, f"profile of {name} is no longer in the catalog", actions, stopping)
        live = [r for r in live if r.id not in stopping]
        leaving = [r for r in live if nodes[r.node].state == "draining"]
        staying = [r for r in live if nodes[r.node].state != "draining"]
        _drain_off(want, leaving, staying, actions, stopping)
        if len(staying) > want.replicas:
            surplus = _stop_order(staying, nodes)[: len(staying) - want.replicas]
            _stop_all(surplus, f"{name} is scaled to {want.replicas}", actions, stopping)
        missing[name] = max(0, want.replicas - len(staying))

    actions.extend(_place(missing, wants, capacity, kept, policy, now))

    routed = sorted(
        r.id for r in kept if r.state == "ready" and r.id not in stopping and r.model in wants
    )
    actions.append(Publish(replicas=tuple(routed)))
    return actions


def _stop_order(rs: Iterable[Replica], nodes: Mapping[str, Node]) -> list[Replica]:
    """Surplus replicas, the first to stop first: idle before serving, on a node that
    is not ready before one that is, newest before oldest (ids backwards on a tie)."""
    by_id = sorted(rs, key=lambda r: r.id, reverse=True)
    return sorted(
        by_id,
        key=lambda r: (_STOP_RANK[r.state], nodes[r.node].state == "ready", -r.created_at),
    )


def _stop_all(rs: Iterable[Replica], why: str, actions: list[Action], stopping: set[str]) -> None:
    for r in rs:
        if r.state == "ready":
            # Out of routing before it drains, or gateways keep sending it requests
            # it will refuse.
            actions.append(Unpublish(replica=r.id))
        actions.append(Stop(replica=r.id, node=r.node, drain=r.state == "ready", reason=why))
        stopping.add(r.id)


def _drain_off(
    want: Want,
    leaving: list[Replica],
    staying: list[Replica],
    actions: list[Action],
    stopping: set[str],
) -> None:
    """Replicas on draining nodes: replaced elsewhere first, stopped once the others are ready.

    A ready one keeps serving until enough ready replicas run elsewhere, so that
    draining a node never takes a model below its wanted count of ready replicas
    while a replacement is starting; anything not serving goes at once.
    """
    why = "its node is draining"
    idle = [r for r in leaving if r.state != "ready"]
    _stop_all(idle, why, actions, stopping)
    serving = [r for r in leaving if r.state == "ready"]
    ready_elsewhere = sum(1 for r in staying if r.state == "ready")
    keep = max(0, min(len(serving), want.replicas - ready_elsewhere))
    # The oldest keep serving; they have the warmest caches.
    _stop_all(serving[keep:], why, actions, stopping)


def _place(
    missing: Mapping[str, int],
    wants: Mapping[str, Want],
    capacity: Capacity,
    replicas: Sequence[Replica],
    policy: PlacementPolicy,
    now: float,
) -> list[Action]:
    """Start the missing replicas: one per model per round, in model order."""
    taken = {r.id for r in replicas}
    counters: dict[str, int] = defaultdict(int)
    out: list[Action] = []
    short: dict[str, int] = {}
    todo = {m: n for m, n in sorted(missing.items()) if n > 0}
    while todo:
        for name in list(todo):
            model = wants[name].model
            got = policy.place(model, capacity)
            if got is None:
                # Nothing smaller of this model will fit later in the pass either.
                short[name] = todo.pop(name)
                continue
            profile, where = got
            capacity.reserve(name, profile, where)
            rid = _new_id(name, taken, counters)
            out.append(
                Start(
                    replica=Replica(
                        id=rid,
                        model=name,
                        profile=profile.name,
                        node=where.node,
                        gpus=where.gpus,
                        state="pending",
                        created_at=now,
                        gpu_memory=profile.gpu_memory,
                        cpu=profile.cpu,
                        memory=profile.memory,
                    )
                )
            )
            todo[name] -= 1
            if todo[name] == 0:
                del todo[name]
    out.extend(Unplaced(model=m, missing=n) for m, n in sorted(short.items()))
    return out


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _new_id(model: str, taken: set[str], counters: dict[str, int]) -> str:
    # Readable and deterministic: MODEL-N with the smallest N no known replica
    # has, stopped ones included, so an id is not reused while anything may
    # still refer to it.
    n = counters[model]
    while True:
        n += 1
        rid = f"{_ID_UNSAFE.sub('-', model)}-{n}"
        if rid not in taken:
            taken.add(rid)
            counters[model] = n
            return rid


def apply(actions: Iterable[Action], observed: Observed) -> Observed:
    """The observed state once `actions` have taken effect, as the store records them.

    Starts become pending replicas, Stops draining ones (stopped is for the agent
    to report), marks change states; Publish, Unpublish and Unplaced change
    nothing here.
    """
    nodes = {n.id: n for n in observed.nodes}
    reps = {r.id: r for r in observed.replicas}
    for a in actions:
        if isinstance(a, MarkNode):
            nodes[a.node] = msgspec.structs.replace(nodes[a.node], state=a.state)
        elif isinstance(a, MarkReplica):
            reps[a.replica] = msgspec.structs.replace(
                reps[a.replica], state=a.state, reason=a.reason
            )
        elif isinstance(a, Start):
            reps[a.replica.id] = a.replica
        elif isinstance(a, Stop):
            # Draining even without `drain`: the replica holds its GPUs until its agent
            # reports it stopped. Marking it stopped at once freed them for the next
            # pass while the engine could still be exiting (the property test found a
            # plan that started a replica on memory its own Stop had only just asked for).
            reps[a.replica] = msgspec.structs.replace(
                reps[a.replica], state="draining", reason=a.reason
            )
    return Observed(nodes=tuple(nodes.values()), replicas=tuple(reps.values()))
