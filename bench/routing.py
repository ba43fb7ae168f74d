"""`python -m bench run routing`: prefix-cache-aware routing against an oracle and vllm-router.

N simulator replicas (prefill time proportional to the prompt tokens not in the
replica's prefix cache; a bounded LRU cache; real token ids from the tiny BPE
fixture; KV events on) serve the shared-prefix multi-turn chat workload of
`bench.workload`, through:

- llmgw's gateway with each policy: round_robin, least_load, prefix, kv;
- the oracle (`bench.oracle`): the bench itself sends each request straight to
  the replica whose cache holds the longest prefix of it;
- vllm-router with `--policy cache_aware`.

Every (round, target) starts a fresh fleet, so each target begins cold, and the
targets take turns within each round (A B C A B C ...). The cache figures come
from the replicas' own counters; imbalance from their request counters.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import msgspec
import uvloop

from bench import peers as peers_mod
from bench.oracle import Oracle, sim_tokenizer
from bench.procs import Sampler, Server
from bench.report import Target, command, git_state, machine_facts, now_iso, result_path, today, versions
from bench.routing_report import (
    ORACLE,
    POLICIES,
    VLLM_ROUTER,
    RoutingResult,
    RoutingRound,
    cache_deltas,
    figures_and_checks,
    fold,
    imbalance,
    llmgw_target,
    table,
)
from bench.routing_stack import (
    VLLM_ROUTER_POLICY,
    Fleet,
    FleetSpec,
    route_kinds,
    sim_args,
    start_llmgw,
    start_vllm_router,
)
from bench.runner import ROOT, schedule
from bench.sessions import ByReplica, Fixed, Router, run_sessions
from bench.workload import Workload, WorkloadSpec, build

SESSIONS = 16  # users in flight at once: 4 per replica when balanced, under max-num-seqs 8
ROUND_S = 120.0  # a round stops taking new turns after this long, whatever is left


def run_routing(args: argparse.Namespace) -> int:
    """Runs the scenario end to end, prints the table and writes the result; returns 0."""
    fleet_spec = FleetSpec()
    if args.replicas:
        fleet_spec = replace(fleet_spec, replicas=args.replicas)
    if args.cache_blocks:
        fleet_spec = replace(fleet_spec, cache_blocks=args.cache_blocks)
    wl_spec = WorkloadSpec()
    if args.users:
        wl_spec = replace(wl_spec, users=args.users)
    if args.turns:
        wl_spec = replace(wl_spec, turns=args.turns)
    if args.tenant_skew is not None:
        wl_spec = replace(wl_spec, tenant_skew=args.tenant_skew)
    if args.quick:
        wl_spec = replace(wl_spec, users=8, turns=3)
    workload = build(wl_spec)
    rounds = 1 if args.quick else args.rounds
    sessions = int(args.concurrency.split(",")[0]) if args.concurrency else SESSIONS
    round_s = args.round_s or ROUND_S
    machine, started = machine_facts(), now_iso()
    code = git_state(str(ROOT))
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-routing-"))
    targets, venv = _targets(fleet_spec, args.peers)
    live = [t.name for t in targets if t.status == "ok" and t.kind != "upstream"]
    all_rounds: list[RoutingRound] = []
    plan = schedule(live, [sessions], rounds)
    for i, (c, r, name) in enumerate(plan, 1):
        t = next(x for x in targets if x.name == name)
        if t.status != "ok":
            continue  # failed in an earlier round: not retried
        try:
            rnd = one_round(name, r, fleet_spec, workload, c, round_s, venv, workdir, t)
        except RuntimeError as e:
            t.status = f"start failed: {str(e)[-600:]}"
            print(f"bench: {name}: {t.status}", file=sys.stderr)
            continue
        all_rounds.append(rnd)
        _progress(i, len(plan), rnd)
    machine.loadavg_end = list(os.getloadavg())
    summary = fold(all_rounds, live)
    figures, checks = figures_and_checks(summary)
    res = RoutingResult(
        scenario="routing",
        date=today(),
        started_at=started,
        finished_at=now_iso(),
        command=command(args),
        machine=machine,
        versions={
            **versions("llmgw", "granian", "uvloop", "httptools", "msgspec"),
            "llmgw_git": code,
        },
        settings=_settings(fleet_spec, wl_spec, workload, rounds, sessions, round_s, args.quick),
        targets=targets,
        rounds=list(all_rounds),
        summary=list(summary),
        void=False,
        void_reason="",
        figures=figures,
        checks=checks,
    )
    out = Path(args.out) if args.out else result_path("routing", res.date, res.machine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(table(res))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _targets(spec: FleetSpec, peers: str) -> tuple[list[Target], Path | None]:
    """The replicas (as the upstream record), the oracle, llmgw per policy, vllm-router if asked."""
    llmgw_v = versions("llmgw")["llmgw"]
    out = [
        Target(
            name="replicas",
            kind="upstream",
            version=llmgw_v,
            command=sim_args(spec, 0, "tcp://127.0.0.1:EV", "tcp://127.0.0.1:RP"),
            notes=f"{spec.replicas} x llmgw engine sim, fresh (cold caches) for every round of every target; "
            "port 0 and EV/RP stand for free ports picked per start",
        ),
        Target(
            name=ORACLE,
            kind="oracle",
            version=llmgw_v,
            command=[],
            notes="in the bench: mirrors each replica's PrefixCache, sends each request straight to "
            "the replica with the longest cached prefix (ties: fewest outstanding, fewest blocks held)",
        ),
    ]
    out += [
        Target(
            name=llmgw_target(p), kind="gateway", version=llmgw_v, command=[], notes=f"policy {p}"
        )
        for p in POLICIES
    ]
    venv = None
    if "vllm-router" in [p for p in peers.split(",") if p]:
        peer = peers_mod.PEERS["vllm-router"]
        t = Target(name=VLLM_ROUTER, kind="gateway", version=peer.version, command=[],
                   notes=f"--policy {VLLM_ROUTER_POLICY}")  # fmt: skip
        log: list[str] = []
        try:
            venv, why = peers_mod.ensure(peer, log)
        except Exception as e:  # noqa: BLE001 - an install failure is reported, the run goes on
            venv, why = None, f"install failed: {e}"
        if venv is None:
            t.status = why
        out.append(t)
    return out, venv


def one_round(
    name: str,
    r: int,
    spec: FleetSpec,
    workload: Workload,
    sessions: int,
    round_s: float,
    venv: Path | None,
    workdir: Path,
    target: Target,
) -> RoutingRound:
    """One run of the workload through `name` on a fresh fleet; everything is stopped after."""
    t0 = time.perf_counter()
    fleet = start_fleet(spec)
    front: Server | None = None
    usage: Path | None = None
    oracle: Oracle | None = None
    try:
        router: Router
        if name == ORACLE:
            oracle = Oracle(
                spec.replicas, spec.block_size, spec.cache_blocks, sim_tokenizer(spec.tokenizer)
            )
            router = ByReplica(fleet.ports, oracle.route, oracle.release)
        elif name == VLLM_ROUTER:
            assert venv is not None
            front = start_vllm_router(fleet, venv, workdir)
            router = Fixed(front.port)
        else:
            policy = name.removeprefix("llmgw-")
            front, usage = start_llmgw(fleet, policy, workdir)
            if policy == "kv":
                time.sleep(0.5)  # let the KV-event subscriptions connect (ZMQ's slow joiner)
            router = Fixed(front.port)
        if front is not None:
            target.command, target.url = front.args, front.url
        before = fleet.scrape()
        with contextlib.ExitStack() as stack:
            sims = [stack.enter_context(Sampler(x.server.pid)) for x in fleet.replicas]
            gw = stack.enter_context(Sampler(front.pid)) if front is not None else None
            res = uvloop.run(run_sessions(workload, router, concurrency=sessions, duration=round_s))
        after = fleet.scrape()
    finally:
        if front is not None:
            front.stop()  # llmgw writes the rest of its usage log on the way out
        fleet.stop()
    reqs, queries, hits = cache_deltas(before, after)
    return RoutingRound(
        round=r,
        target=name,
        concurrency=sessions,
        stream=True,
        result=res,
        server_cpu=gw.cpu if gw is not None else None,
        server_rss_mb=gw.rss_max_mb if gw is not None else None,
        upstream_cpu=sum(s.cpu for s in sims),
        replica_requests=reqs,
        prompt_tokens=queries,
        hit_tokens=hits,
        hit_ratio=hits / queries if queries else None,
        imbalance=imbalance(reqs),
        route_kinds=route_kinds(usage) if usage is not None else {},
        mirror_hit_ratio=(oracle.hits / oracle.queries) if oracle and oracle.queries else None,
        wall_s=time.perf_counter() - t0,
    )


def start_fleet(spec: FleetSpec, tries: int = 3) -> Fleet:
    """A started fleet; a failed start (a free port taken meanwhile: ZMQ's bind fails) is retried
    with new ports, so that it does not count against the target of the round."""
    for attempt in range(1, tries + 1):
        fleet = Fleet(spec)
        try:
            fleet.start()
            return fleet
        except RuntimeError as e:
            if attempt == tries:
                raise
            print(
                f"bench: fleet start failed, retrying: {str(e).splitlines()[-1]}", file=sys.stderr
            )
    raise AssertionError("unreachable")


def _progress(i: int, n: int, r: RoutingRound) -> None:
    res = r.result
    ttft = res.ttft_ms
    print(
        f"bench: [{i}/{n}] round {r.round} {r.target:<18} hit {r.hit_ratio or 0:.3f}  "
        f"TTFT p50 {ttft.get('p50') or 0:.1f} p90 {ttft.get('p90') or 0:.1f} ms  "
        f"{res.rps:.1f} req/s  per replica {r.replica_requests}  "
        f"{sum(res.errors.values())} errors {res.cut} cut  ({r.wall_s:.1f} s)",
        file=sys.stderr,
    )


def _settings(
    fleet: FleetSpec, wl: WorkloadSpec, workload: Workload, rounds: int, sessions: int,
    round_s: float, quick: bool,
) -> dict[str, bool | int | float | str | list[int]]:  # fmt: skip
    s: dict[str, bool | int | float | str | list[int]] = {
        "rounds": rounds, "sessions": sessions, "round_s": round_s, "quick": quick,
        "requests_per_round": workload.requests, "stream": True,
        "void_rule": "not applicable: the replicas' simulated prefill is what is measured",
    }  # fmt: skip
    s |= {f"fleet_{k}": v for k, v in asdict(fleet).items()}
    s |= {f"workload_{k}": v for k, v in asdict(wl).items()}
    return s
