"""`python -m bench.control`: one reconcile pass over a large simulated fleet, timed.

Two figures: the first pass (every replica placed from nothing) and a steady
pass (everything placed and ready: liveness, counting, publishing), which is
the one that runs every few seconds. The issue's target is a pass under
500 ms for 1,000 nodes of 8 GPUs and 300 models.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.control", description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the result here (bench/results/control-DATE.json)")
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
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(msgspec.json.format(msgspec.json.encode(result)).decode())
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
