"""Small builders for nodes, GPUs, models and replicas in control-plane tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmgw.control.catalog import Engine, Model, NVLink, Profile, Source
from llmgw.control.inventory import Gpu, Node, NodeState, Replica, ReplicaState
from llmgw.control.placement import Placement

GiB = 2**30
H100 = "H100-80GB"
A100 = "A100-40GB"


def gpus(
    node: str,
    n: int,
    cls: str = H100,
    total: int = 80 * GiB,
    free: Sequence[int] | None = None,
    islands: Iterable[Iterable[int]] | None = None,
    simulated: bool = False,
    start: int = 0,
) -> tuple[Gpu, ...]:
    """`n` GPUs of one class; `islands` are groups of indices that are all NVLink peers."""
    peers: dict[int, set[int]] = {}
    for group in islands or ():
        g = list(group)
        for i in g:
            peers.setdefault(i, set()).update(j for j in g if j != i)
    return tuple(
        Gpu(
            uuid=f"{node}-gpu{i}",
            index=i,
            model=f"NVIDIA {cls}",
            gpu_class=cls,
            memory_total=total,
            memory_free=total if free is None else free[i - start],
            nvlink_peers=tuple(sorted(peers.get(i, ()))),
            simulated=simulated,
        )
        for i in range(start, start + n)
    )


def node(
    nid: str,
    n: int = 8,
    cls: str = H100,
    *,
    state: NodeState = "ready",
    heartbeat: float = 1000.0,
    **kw: object,
) -> Node:
    """A ready node with `n` GPUs of one class, all free, fully NVLink-connected."""
    g = kw.pop("gpus", None)
    if g is None:
        g = gpus(nid, n, cls, islands=[range(n)])
    kw.setdefault("cpu_cores", 64.0)
    kw.setdefault("memory_bytes", 512 * GiB)
    return Node(id=nid, hostname=f"{nid}.lan", state=state, last_heartbeat=heartbeat, gpus=g, **kw)  # type: ignore[arg-type]


def profile(
    name: str = "default",
    cls: str | None = H100,
    count: int = 1,
    mem: int = 40 * GiB,
    engine: Engine = "vllm",
    nvlink: NVLink = "prefer",
    **kw: object,
) -> Profile:
    return Profile(
        name=name,
        engine=engine,
        gpu_class=cls,
        gpu_count=count if cls else 0,
        gpu_memory=mem if cls else 0,
        nvlink=nvlink,
        **kw,  # type: ignore[arg-type]
    )


def model(name: str, *profiles: Profile, min_replicas: int = 1, **kw: object) -> Model:
    return Model(
        name=name,
        source=Source(repo=f"org/{name}"),
        profiles=list(profiles) or [profile()],
        min_replicas=min_replicas,
        **kw,  # type: ignore[arg-type]
    )


def replica(
    rid: str,
    m: Model,
    nid: str,
    gpu_idx: Sequence[int] = (0,),
    state: ReplicaState = "ready",
    created_at: float = 0.0,
    prof: int = 0,
) -> Replica:
    p = m.profiles[prof]
    return Replica(
        id=rid,
        model=m.name,
        profile=p.name,
        node=nid,
        gpus=tuple(f"{nid}-gpu{i}" for i in gpu_idx),
        state=state,
        created_at=created_at,
        gpu_memory=p.gpu_memory,
        cpu=p.cpu,
        memory=p.memory,
    )


def where(p: tuple[Profile, Placement] | None) -> tuple[str, str, tuple[int, ...]] | None:
    """(profile, node, GPU indices) of a placement, for compact assertions."""
    if p is None:
        return None
    return p[1].profile, p[1].node, p[1].gpu_indices
