"""Properties of placement and the reconciler over random fleets and catalogs.

For any inventory and any models: no GPU's memory is promised twice over, a
multi-GPU replica's GPUs are on its one node and of its class, replicas start
only on ready nodes, and a plan applied to its own result converges (the next
pass at the same moment starts, stops and marks nothing).
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control.capacity import Capacity
from llmgw.control.catalog import Model, Profile, Source
from llmgw.control.inventory import RESERVING, Gpu, Node, Observed
from llmgw.control.placement import BinPacking, Placement
from llmgw.control.reconciler import Publish, Start, Timing, Unplaced, Want, apply, plan
from llmgw.control.settings import Settings

GiB = 2**30
CLASSES = ("H100-80GB", "A100-40GB")
SETTINGS = Timing.of(Settings(unreachable_after=30, lost_after=120))
NOW = 10_000.0


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        nid = f"n{i}"
        n = draw(st.integers(0, 8))
        cls = draw(st.sampled_from(CLASSES))
        total = draw(st.sampled_from((24, 40, 80))) * GiB
        edges = draw(st.sets(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=16))
        simulated = draw(st.sampled_from((False, False, False, True)))
        gpus = tuple(
            Gpu(
                uuid=f"{nid}-gpu{j}",
                index=j,
                model=cls,
                gpu_class=cls,
                memory_total=total,
                memory_free=draw(st.integers(total // 2, total)),
                # One side of each link only: the ledger must make them symmetric.
                nvlink_peers=tuple(sorted({b for a, b in edges if a == j and b < n})),
                simulated=simulated,
            )
            for j in range(n)
        )
        out.append(
            Node(
                id=nid,
                hostname=nid,
                gpus=gpus,
                cpu_cores=draw(st.sampled_from((4.0, 16.0, 64.0))),
                memory_bytes=draw(st.sampled_from((16, 64, 512))) * GiB,
                state=draw(st.sampled_from(("ready", "ready", "cordoned", "unreachable"))),
                admin_state=draw(
                    st.sampled_from(("ready", "ready", "ready", "cordoned", "draining"))
                ),
                last_heartbeat=NOW - draw(st.sampled_from((0, 0, 0, 45, 200))),
                engines=draw(st.sampled_from(((), (), ("vllm", "sim"), ("llamacpp",)))),
            )
        )
    return tuple(out)


@st.composite
def profiles(draw: st.DrawFn, name: str) -> Profile:
    cls = draw(st.sampled_from((*CLASSES, None)))
    return Profile(
        name=name,
        engine=draw(st.sampled_from(("vllm", "sim", "llamacpp"))),
        gpu_class=cls,
        gpu_count=draw(st.sampled_from((1, 1, 2, 4))) if cls else 0,
        gpu_memory=draw(st.integers(1, 40)) * GiB if cls else 0,
        nvlink=draw(st.sampled_from(("prefer", "require"))),
        cpu=float(draw(st.sampled_from((0, 0, 2, 8)))),
        memory=draw(st.sampled_from((0, 0, 8, 64))) * GiB,
    )


@st.composite
def wants(draw: st.DrawFn) -> list[Want]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        ps = [draw(profiles(f"p{j}")) for j in range(draw(st.integers(1, 2)))]
        m = Model(name=f"m{i}", source=Source(repo=f"o/m{i}"), profiles=ps, max_replicas=6)
        out.append(Want(model=m, replicas=draw(st.integers(0, 5))))
    return out


def check_invariants(obs: Observed, desired: list[Want]) -> None:
    gpus = {g.uuid: (n.id, g) for n in obs.nodes for g in n.gpus}
    held: dict[str, int] = defaultdict(int)
    models = {w.model.name: w.model for w in desired}
    for r in obs.replicas:
        if r.state not in RESERVING:
            continue
        profile = models[r.model].profile(r.profile)
        assert profile is not None
        assert len(r.gpus) == len(set(r.gpus)) == profile.gpu_count
        for u in r.gpus:
            node_id, gpu = gpus[u]
            assert node_id == r.node, f"{r.id} spans nodes"
            assert gpu.gpu_class == profile.gpu_class
            held[u] += r.gpu_memory
    for u, total in held.items():
        assert total <= gpus[u][1].memory_total, f"{u} is over-committed"


@settings(max_examples=150, deadline=None)
@given(fleet=nodes(), desired=wants(), data=st.data())
def test_plans_never_overcommit_and_converge(
    fleet: tuple[Node, ...], desired: list[Want], data: st.DataObject
) -> None:
    obs = Observed(nodes=fleet)
    now = NOW
    for _ in range(3):
        actions = plan(desired, obs, now, settings=SETTINGS)
        obs = apply(actions, obs)
        check_invariants(obs, desired)
        states = {n.id: n.state for n in obs.nodes}
        for a in actions:
            if isinstance(a, Start):
                assert states[a.node] == "ready"
        # Converges: the same pass again only republishes and reports what cannot fit.
        again = plan(desired, obs, now, settings=SETTINGS)
        assert all(isinstance(a, Publish | Unplaced) for a in again), again
        # Then time passes and agents report some replicas ready.
        up = data.draw(st.sets(st.sampled_from([r.id for r in obs.replicas] or ["-"])))
        obs = msgspec.structs.replace(
            obs,
            replicas=tuple(
                msgspec.structs.replace(r, state="ready")
                if r.id in up and r.state in ("pending", "starting")
                else r
                for r in obs.replicas
            ),
        )
        now += data.draw(st.sampled_from((0.0, 40.0, 150.0)))
        # And operators rescale some models.
        desired = [Want(model=w.model, replicas=data.draw(st.integers(0, 5))) for w in desired]


def _scan(model: Model, capacity: Capacity) -> tuple[Profile, Placement] | None:
    """The reference `BinPacking.place`: every node asked, the smallest full key wins."""
    policy, best = BinPacking(), None
    for nc in capacity.nodes.values():
        got = policy.first_fit(nc, model)
        if isinstance(got, list):
            continue
        rank, profile, fit = got
        key = (nc.models[model.name], rank, 0 if profile.gpu_count < 2 or fit.nvlinked else 1,
               fit.leftover, nc.node.id)
        if best is None or key < best[0]:
            best = (key, nc.node.id, profile, fit)
    if best is None:
        return None
    _, nid, profile, fit = best
    return profile, Placement(node=nid, profile=profile.name,
                              gpus=tuple(c.gpu.uuid for c in fit.gpus),
                              gpu_indices=tuple(c.gpu.index for c in fit.gpus),
                              nvlinked=fit.nvlinked)


@settings(max_examples=150, deadline=None)
@given(fleet=nodes(), desired=wants(), data=st.data())
def test_indexed_placement_chooses_what_asking_every_node_would(
    fleet: tuple[Node, ...], desired: list[Want], data: st.DataObject
) -> None:
    # Two ledgers side by side through a pass's worth of placements, in a random model order.
    fast, slow = Capacity(fleet, ()), Capacity(fleet, ())
    models = [w.model for w in desired]
    for _ in range(data.draw(st.integers(1, 24))):
        m = data.draw(st.sampled_from(models))
        got, want = BinPacking().place(m, fast), _scan(m, slow)
        assert got == want
        if got is not None:
            fast.reserve(m.name, got[0], got[1])
            slow.reserve(m.name, got[0], got[1])
