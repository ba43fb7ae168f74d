"""`python -m bench.control`: one reconcile pass over a large simulated fleet, and heartbeats.

Two reconcile figures: the first pass (every replica placed from nothing) and a
steady pass (everything placed and ready: liveness, counting, publishing), which
is the one that runs every few seconds. The target is a pass under
500 ms for 1,000 nodes of 8 GPUs and 300 models.

Heartbeats: the agent service's own handling (`AgentService._read`, in process,
not over gRPC streams) of `--agents` registered agents of 8 GPUs, each running one
ready replica, every heartbeat parsed from its protobuf bytes (8 GPU loads and
the replica's status) and folded into the `Fleet` (a SQLite store in memory; a
steady heartbeat writes nothing). All agents' streams run at once, `--beats` in
all. Figures: heartbeats per second of wall time and per CPU-second of this
process; the target is over 10,000 a second for 1,000 agents. The gRPC
transport (HTTP/2 framing in grpc's C core) is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from llmgw.control.catalog import Model, Profile, Source
from llmgw.control.inventory import Gpu, Node, Observed
from llmgw.control.reconciler import Start, Want, apply, plan

GiB = 2**30
NOW = 1_000_000.0


def fleet(n_nodes: int, gpus_per_node: int) -> tuple[Node, ...]:
    """Nodes alternating H100 and A100, every node fully NVLink-connected."""
    out = []
    for i in range(n_nodes):
        cls, total = ("H100-80GB", 80 * GiB) if i % 2 == 0 else ("A100-40GB", 40 * GiB)
        gpus = tuple(
            Gpu(
                uuid=f"n{i}-g{j}",
                index=j,
                model=cls,
                gpu_class=cls,
                memory_total=total,
                memory_free=total,
                nvlink_peers=tuple(k for k in range(gpus_per_node) if k != j),
            )
            for j in range(gpus_per_node)
        )
        out.append(
            Node(
                id=f"n{i:04d}",
                hostname=f"n{i}",
                gpus=gpus,
                cpu_cores=128.0,
                memory_bytes=1024 * GiB,
                last_heartbeat=NOW,
            )
        )
    return tuple(out)


def catalog(n_models: int) -> list[Want]:
    """Models of 1, 2 and 4 GPUs, with an H100 profile first and an A100 one second."""
    out = []
    for i in range(n_models):
        count = (1, 1, 2, 4)[i % 4]
        profiles = [
            Profile(
                name="h100",
                engine="vllm",
                gpu_class="H100-80GB",
                gpu_count=count,
                gpu_memory=30 * GiB,
            ),
            Profile(
                name="a100",
                engine="vllm",
                gpu_class="A100-40GB",
                gpu_count=count,
                gpu_memory=30 * GiB,
            ),
        ]
        m = Model(
            name=f"model-{i:03d}",
            source=Source(repo=f"org/m{i}"),
            profiles=profiles,
            min_replicas=2,
            max_replicas=8,
        )
        out.append(Want(model=m, replicas=2 + i % 3))
    return out


def timed(desired: list[Want], obs: Observed, runs: int) -> tuple[list[float], Observed, int]:
    times, actions = [], []
    for _ in range(runs):
        t = time.perf_counter()
        actions = plan(desired, obs, NOW)
        times.append((time.perf_counter() - t) * 1000)
    return times, apply(actions, obs), sum(isinstance(a, Start) for a in actions)


class _Link:
    """An agent stream's command side; a steady fleet sends nothing."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.sent = 0

    def start(self, *a: object) -> None:
        self.sent += 1

    def stop(self, *a: object) -> None:
        self.sent += 1

    def request_logs(self, *a: object) -> None:
        self.sent += 1

    def close(self) -> None:
        pass


async def _heartbeats(n_agents: int, gpus: int, beats: int) -> dict[str, float]:
    import tempfile
    from types import SimpleNamespace

    from llmgw.control.agents import AgentService, registration
    from llmgw.control.fleet import Fleet
    from llmgw.control.inventory import Replica
    from llmgw.control.settings import Settings
    from llmgw.store import connect, migrate
    from llmgw.v1 import agent_pb2 as pb

    with tempfile.TemporaryDirectory(prefix="llmgw-bench-control-") as tmp:
        db = await connect(f"sqlite:///{tmp}/fleet.db")
        try:
            await migrate(db)
            fleet = Fleet(db, Settings(), [], b"s" * 32)
            service = AgentService(SimpleNamespace(fleet=fleet))
            links, raw = [], []
            for i in range(n_agents):
                node = f"n{i:04d}"
                uuids = [f"GPU-{i:04d}-{j}" for j in range(gpus)]
                reg = pb.Register(node_id=node, hostname=node, cpu_count=128, memory_bytes=1 << 40,
                                  gpus=[pb.Gpu(uuid=u, index=j, model="NVIDIA H100 80GB HBM3",
                                               memory_total_bytes=80 * GiB, memory_free_bytes=80 * GiB,
                                               nvlink_peers=[v for v in uuids if v != u])
                                        for j, u in enumerate(uuids)])
                link = _Link(node)
                await fleet.register(registration(reg, "ipv4:127.0.0.1:5000"), link)
                rid = f"r-{i:04d}"
                fleet.replicas[rid] = Replica(id=rid, model="m", profile="p", node=node,
                                              gpus=tuple(uuids[:2]), state="ready", port=8000)
                links.append(link)
                raw.append(pb.AgentMessage(heartbeat=pb.Heartbeat(
                    seq=1,
                    gpus=[pb.GpuLoad(uuid=u, utilization_percent=50, memory_used_bytes=40 * GiB,
                                     memory_free_bytes=40 * GiB) for u in uuids],
                    replicas=[pb.ReplicaStatus(replica_id=rid, model="m", state=pb.REPLICA_STATE_READY,
                                               port=8000, engine_pid=1000 + i)],
                )).SerializeToString())
            per = max(beats // n_agents, 1)

            async def stream(k: int) -> Any:
                for _ in range(per):
                    # Parsed here, as grpc's deserializer does for each message of a stream.
                    yield pb.AgentMessage.FromString(raw[k])
                    await asyncio.sleep(0)  # streams interleave, as they arrive

            c0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(service._read(fleet, stream(k), links[k]) for k in range(n_agents)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            done = per * n_agents
            assert all(fleet.nodes[ln.node_id].gpus[0].memory_free == 40 * GiB for ln in links)
            assert not any(ln.sent for ln in links), "a steady heartbeat sent a command"
            return {"heartbeat_agents": n_agents, "heartbeats": done,
                    "heartbeats_per_s": round(done / wall), "heartbeats_per_cpu_s": round(done / cpu),
                    "heartbeat_us": round(cpu / done * 1e6, 1)}
        finally:
            await db.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.control", description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--agents", type=int, default=1000, help="agents sending heartbeats")
    ap.add_argument("--beats", type=int, default=50_000, help="heartbeats in all")
    ap.add_argument("--json", help="write the result here (bench/results/control-DATE-HOST.json)")
    args = ap.parse_args(argv)

    desired = catalog(args.models)
    obs = Observed(nodes=fleet(args.nodes, args.gpus))
    first, obs, started = timed(desired, obs, 1)
    obs = msgspec.structs.replace(
        obs, replicas=tuple(msgspec.structs.replace(r, state="ready") for r in obs.replicas)
    )
    steady, _, again = timed(desired, obs, args.runs)
    result = {
        "scenario": "control",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "models": args.models,
        "replicas": len(obs.replicas),
        "first_pass_ms": round(first[0], 1),
        "first_pass_starts": started,
        "steady_pass_ms_median": round(statistics.median(steady), 1),
        "steady_pass_ms_max": round(max(steady), 1),
        "steady_pass_starts": again,
        **asyncio.run(_heartbeats(args.agents, args.gpus, args.beats)),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(msgspec.json.format(msgspec.json.encode(result)).decode())
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
