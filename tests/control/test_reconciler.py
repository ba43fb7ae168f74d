"""The reconciler: scenarios from placement to lost nodes, drains, parking and scale from zero."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from inline_snapshot import snapshot

from llmgw.control.catalog import Model
from llmgw.control.inventory import Node, Observed, Replica
from llmgw.control.reconciler import (
    Action,
    MarkNode,
    MarkReplica,
    Publish,
    Start,
    Stop,
    Timing,
    Unplaced,
    Unpublish,
    Want,
    apply,
    plan,
    wake,
    wanted,
)
from llmgw.control.settings import Settings
from tests.support.inventory import GiB, model, node, profile, replica

T0 = 1000.0
SETTINGS = Timing.of(Settings(unreachable_after=30, lost_after=120))


def run(
    models: Sequence[Model] | Sequence[Want], obs: Observed, now: float = T0
) -> tuple[list[Action], Observed]:
    """One pass: the plan, and the state once it took effect."""
    desired = [m if isinstance(m, Want) else Want(model=m, replicas=m.min_replicas) for m in models]
    actions = plan(desired, obs, now, settings=SETTINGS)
    return actions, apply(actions, obs)


def starts(actions: Sequence[Action]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(a.replica.id, a.node, a.gpus) for a in actions if isinstance(a, Start)]


def kinds(actions: Sequence[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def ready(obs: Observed, *ids: str) -> Observed:
    """The agents report these replicas ready."""
    reps = tuple(
        msgspec.structs.replace(r, state="ready") if r.id in ids else r for r in obs.replicas
    )
    return msgspec.structs.replace(obs, replicas=reps)


def heartbeat(obs: Observed, now: float, *nodes: str) -> Observed:
    ns = tuple(
        msgspec.structs.replace(n, last_heartbeat=now) if n.id in nodes else n for n in obs.nodes
    )
    return msgspec.structs.replace(obs, nodes=ns)


def set_admin(obs: Observed, nid: str, state: str) -> Observed:
    ns = tuple(
        msgspec.structs.replace(n, admin_state=state) if n.id == nid else n for n in obs.nodes
    )
    return msgspec.structs.replace(obs, nodes=ns)


def two_nodes() -> tuple[Node, ...]:
    return (node("a", 2, heartbeat=T0), node("b", 2, heartbeat=T0))


def test_two_replicas_go_one_on_each_node_and_a_second_pass_changes_nothing() -> None:
    m = model("llama", profile(mem=60 * GiB), min_replicas=2)
    actions, obs = run([m], Observed(nodes=two_nodes()))
    assert starts(actions) == [("llama-1", "a", ("a-gpu0",)), ("llama-2", "b", ("b-gpu0",))]
    assert [r.state for r in obs.replicas] == ["pending", "pending"]
    again, _ = run([m], obs)
    assert again == [Publish(replicas=())]
    again, _ = run([m], ready(obs, "llama-1", "llama-2"))
    assert again == [Publish(replicas=("llama-1", "llama-2"))]


def test_a_silent_node_goes_unreachable_then_lost_and_its_replica_moves_once() -> None:
    m = model("llama", profile(mem=60 * GiB), min_replicas=2)
    _, obs = run([m], Observed(nodes=two_nodes()))
    obs = ready(obs, "llama-1", "llama-2")
    # b stops reporting at T0; a keeps heartbeating.
    t = T0 + 31
    actions, obs = run([m], heartbeat(obs, t, "a"), t)
    # Unreachable: still routed (the gateway's own probes judge the engine), not replaced.
    assert actions == snapshot(
        [
            MarkNode(
                node="b",
                state="unreachable",
                reason="no heartbeat for 31 s (unreachable after 30 s)",
            ),
            Publish(replicas=("llama-1", "llama-2")),
        ]
    )
    t = T0 + 121
    actions, obs = run([m], heartbeat(obs, t, "a"), t)
    assert actions == snapshot(
        [
            MarkNode(node="b", state="lost", reason="no heartbeat for 121 s (lost after 120 s)"),
            Unpublish(replica="llama-2"),
            MarkReplica(replica="llama-2", state="stopped", reason="node b was lost"),
            Start(
                replica=Replica(
                    id="llama-3",
                    model="llama",
                    profile="default",
                    node="a",
                    gpus=("a-gpu1",),
                    state="pending",
                    created_at=1121.0,
                    gpu_memory=64424509440,
                )
            ),
            Publish(replicas=("llama-1",)),
        ]
    )
    # Exactly once: the next passes start nothing more.
    for dt in (1, 60):
        again, obs = run([m], heartbeat(obs, t + dt, "a"), t + dt)
        assert not starts(again) and "Stop" not in kinds(again)
    # b comes back: ready again, but its old replica stays stopped and is not counted.
    t += 61
    back, obs = run([m], heartbeat(obs, t, "a", "b"), t)
    assert back[0] == MarkNode(node="b", state="ready", reason="heartbeats again")
    assert not starts(back)


def test_an_unreachable_node_that_returns_keeps_its_operator_state() -> None:
    obs = Observed(nodes=(node("a", 1, heartbeat=T0, state="unreachable", admin_state="cordoned"),))
    actions, _ = run([], obs, T0 + 1)
    assert actions[0] == MarkNode(node="a", state="cordoned", reason="heartbeats again")


def test_a_cordoned_node_keeps_its_replicas_and_takes_no_new_ones() -> None:
    m = model("llama", profile(mem=60 * GiB), min_replicas=1)
    _, obs = run([m], Observed(nodes=two_nodes()))
    obs = ready(obs, "llama-1")
    actions, obs = run([m], set_admin(obs, "a", "cordoned"))
    assert actions == [
        MarkNode(node="a", state="cordoned", reason="set cordoned by an operator"),
        Publish(replicas=("llama-1",)),
    ]
    # Scaled up, the new replicas avoid a; the second one that a cannot take is unplaced
    # even though b has room, because spreading only orders and b takes the rest.
    more = Want(model=m, replicas=3)
    actions, obs = run([more], obs)
    assert starts(actions) == [("llama-2", "b", ("b-gpu0",)), ("llama-3", "b", ("b-gpu1",))]
    actions, _ = run([Want(model=m, replicas=4)], obs)
    assert [a for a in actions if isinstance(a, Unplaced)] == [Unplaced(model="llama", missing=1)]


def test_draining_a_node_replaces_its_replicas_before_stopping_them() -> None:
    m = model("llama", profile(mem=60 * GiB), min_replicas=1)
    _, obs = run([m], Observed(nodes=two_nodes()))
    obs = ready(obs, "llama-1")
    actions, obs = run([m], set_admin(obs, "a", "draining"))
    # The replacement starts on b; llama-1 keeps serving meanwhile.
    assert kinds(actions) == ["MarkNode", "Start", "Publish"]
    assert starts(actions) == [("llama-2", "b", ("b-gpu0",))]
    assert actions[-1] == Publish(replicas=("llama-1",))
    actions, obs = run([m], obs)
    assert kinds(actions) == ["Publish"]
    # Once the replacement is ready, the old one leaves routing, then drains.
    actions, obs = run([m], ready(obs, "llama-2"))
    assert actions == [
        Unpublish(replica="llama-1"),
        Stop(replica="llama-1", node="a", drain=True, reason="its node is draining"),
        Publish(replicas=("llama-2",)),
    ]
    assert {r.id: r.state for r in obs.replicas} == {"llama-1": "draining", "llama-2": "ready"}
    assert run([m], obs)[0] == [Publish(replicas=("llama-2",))]


def test_a_parked_replica_is_not_restarted_or_replaced() -> None:
    m = model("llama", profile(mem=60 * GiB), min_replicas=1)
    parked = msgspec.structs.replace(
        replica("llama-1", m, "a", state="parked"), reason="engine exited 5 times: CUDA OOM"
    )
    obs = Observed(nodes=two_nodes(), replicas=(parked,))
    assert run([m], obs)[0] == [Publish(replicas=())]
    # Retried by an operator (the store sets it pending): its GPUs are still held for it.
    retried = msgspec.structs.replace(
        obs, replicas=(msgspec.structs.replace(parked, state="pending"),)
    )
    assert run([m], retried)[0] == [Publish(replicas=())]


def test_scale_to_zero_and_wake() -> None:
    m = model("gemma", profile(mem=10 * GiB), min_replicas=0)
    _, obs = run(wanted([m], awake=["gemma"]), Observed(nodes=two_nodes()))
    assert [r.id for r in obs.replicas] == ["gemma-1"]
    obs = ready(obs, "gemma-1")
    # Nobody asks any more: the wiring stops waking it, and it drains away.
    actions, obs = run(wanted([m]), obs)
    assert actions == [
        Unpublish(replica="gemma-1"),
        Stop(replica="gemma-1", node="a", drain=True, reason="gemma is scaled to 0"),
        Publish(replicas=()),
    ]
    # A request arrives: wake asks for one, and a new replica starts.
    actions, _ = run([wake(w) for w in wanted([m])], obs)
    # Its draining predecessor still holds 10 GiB of a-gpu0, which makes a the fullest fit.
    assert starts(actions) == [("gemma-2", "a", ("a-gpu0",))]


def test_wake_respects_scale_from_zero() -> None:
    m = model("m", min_replicas=0, scale_from_zero=False)
    assert wake(Want(model=m, replicas=0)).replicas == 0
    assert wake(Want(model=model("n", min_replicas=0), replicas=0)).replicas == 1
    assert wake(Want(model=model("n", min_replicas=2), replicas=2)).replicas == 2


def test_explicit_scale_is_held_to_min_and_max() -> None:
    m = model("m", min_replicas=1, max_replicas=3)
    assert [w.replicas for w in wanted([m], {"m": 9})] == [3]
    assert [w.replicas for w in wanted([m], {"m": 0})] == [1]
    assert [w.replicas for w in wanted([m])] == [1]


def test_scaling_down_stops_the_least_useful_replica_first() -> None:
    m = model("llama", profile(mem=10 * GiB), min_replicas=1)
    reps = (
        replica("old", m, "a", [0], created_at=1),
        replica("new", m, "b", [0], created_at=5),
        replica("starting", m, "a", [1], state="starting", created_at=2),
    )
    actions, _ = run([Want(model=m, replicas=1)], Observed(nodes=two_nodes(), replicas=reps))
    assert actions == [
        Stop(replica="starting", node="a", drain=False, reason="llama is scaled to 1"),
        Unpublish(replica="new"),
        Stop(replica="new", node="b", drain=True, reason="llama is scaled to 1"),
        Publish(replicas=("old",)),
    ]


def test_a_model_removed_from_the_catalog_is_stopped() -> None:
    m = model("llama")
    obs = Observed(nodes=two_nodes(), replicas=(replica("llama-1", m, "a"),))
    actions, _ = run([], obs)
    assert actions == [
        Unpublish(replica="llama-1"),
        Stop(
            replica="llama-1",
            node="a",
            drain=True,
            reason="model llama is no longer in the catalog",
        ),
        Publish(replicas=()),
    ]


def test_models_take_turns_when_capacity_is_short() -> None:
    # Three GPUs for two models that want two each: each gets one before either gets two.
    big = model("a-big", profile(mem=60 * GiB), min_replicas=2)
    small = model("b-small", profile(mem=60 * GiB), min_replicas=2)
    nodes = (node("a", 2, heartbeat=T0), node("b", 1, heartbeat=T0))
    actions, _ = run([big, small], Observed(nodes=nodes))
    assert [(a.replica.model, a.node) for a in actions if isinstance(a, Start)] == [
        ("a-big", "b"),  # the fullest node that fits
        ("b-small", "a"),
        ("a-big", "a"),  # spread: a-big is already on b
    ]
    assert [a for a in actions if isinstance(a, Unplaced)] == [Unplaced(model="b-small", missing=1)]


def test_replica_ids_are_never_reused_while_known() -> None:
    m = model("org/llama", profile(mem=10 * GiB), min_replicas=1)
    gone = replica("org-llama-1", m, "a", state="stopped")
    actions, _ = run([m], Observed(nodes=two_nodes(), replicas=(gone,)))
    assert [s[0] for s in starts(actions)] == ["org-llama-2"]


def test_settings_refuse_lost_before_unreachable() -> None:
    # The check lives in the control plane's Settings, the one source of the timing.
    with pytest.raises(ValueError, match="lost_after"):
        Settings(unreachable_after=60, lost_after=30)


def test_timing_is_the_control_planes() -> None:
    assert Timing.of(Settings()) == Timing(unreachable_after=30.0, lost_after=120.0)
