"""The standard scenarios (docs/benchmarks.md) and `soak`.

- overhead: one client at a time; added p50/p99 latency over going direct.
- throughput: concurrency 1, 32, 256, non-streamed; req/s, p50/p99, gateway CPU and RSS.
- streaming: many concurrent streams of N chunks; added TTFT and added time per chunk.
- soak: llmgw alone, N requests at c=32; RSS after each half and its growth.
- routing: prefix-cache-aware routing policies against an oracle and vllm-router
  (bench/routing.py).
- index: the KV-event index's Rust bench, against its targets (bench/index.py).
- usage: usage ingestion into SQLite and PostgreSQL, requests recorded per second (bench/usage.py).
- keyed-cost: plain and keyed llmgw at one fixed rate in the same windows; CPU per request of
  each and their ratio (bench/keyed_cost.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from bench.base import NAME as BASE
from bench.base import BaseError, export
from bench.keyed import NAME as KEYED
from bench.load import LoadSpec, run_load
from bench.procs import TICK, Sampler, group_pids, rss_bytes
from bench.report import (
    DIRECT,
    Result,
    Round,
    Row,
    command,
    git_state,
    machine_facts,
    now_iso,
    result_path,
    summary_table,
    today,
    versions,
    void_check,
)
from bench.runner import (
    MODEL,
    ROOT,
    Stack,
    fold,
    paired_added,
    paired_rps_ratio,
    rps_pairs,
    run_rounds,
    schedule,
)
from bench.stats import bootstrap_ratio


@dataclass(frozen=True)
class Own:
    """A scenario's own harness: its runner, its result type and its table, each named as
    "module:attribute" and imported only when used (`load`; each pulls in what it needs)."""

    run: str
    result: str
    table: str


def load(ref: str) -> Any:
    """The object a "module:attribute" reference names, imported."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _own(module: str, run: str, result: str, table_module: str | None = None) -> Own:
    report = table_module or module
    return Own(f"{module}:{run}", f"{report}:{result}", f"{report}:markdown")


@dataclass(frozen=True)
class Scenario:
    """A scenario's fixed shape; rounds and durations come from the command line. One with
    its `own` harness runs that instead, and its shape is not used."""

    concurrencies: tuple[int, ...]
    stream: bool
    output_tokens: int
    round_s: float
    own: Own | None = None


SCENARIOS: dict[str, Scenario] = {
    "overhead": Scenario((1,), False, 16, 2.0),
    "throughput": Scenario((1, 32, 256), False, 16, 2.0),
    "streaming": Scenario((128,), True, 64, 3.0),
    "soak": Scenario((32,), False, 16, 0.0),
    "routing": Scenario((16,), True, 16, 60.0,
                        _own("bench.routing", "run_routing", "RoutingResult", "bench.routing_report")),
    "index": Scenario((1,), False, 0, 0.0, _own("bench.index", "run_index", "IndexResult")),
    "usage": Scenario((1,), False, 0, 0.0, _own("bench.usage", "run_usage", "UsageResult")),
    # In process: what API keys and limits add per request.
    "auth": Scenario((1,), False, 0, 0.0, _own("bench.auth", "run_auth", "AuthResult")),
    # Plain and keyed llmgw at one fixed rate in the same windows: CPU per request.
    "keyed-cost": Scenario((16,), False, 0, 4.0,
                           _own("bench.keyed_cost", "run_keyed_cost", "KeyedCostResult")),
}


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `soak`."""
    p.add_argument("--rounds", type=int, default=5, help="rounds per target and level (default 5)")
    p.add_argument("--round-s", type=float, help="seconds per round (default: the scenario's)")
    p.add_argument(
        "--quick", action="store_true", help="2 rounds of 1 s: a smoke run, not a result"
    )
    p.add_argument(
        "--peers",
        default="llmgw-keys,vllm-router,sglang-router,litellm",
        help="comma-separated peers to include ('' for none)",
    )
    p.add_argument("--concurrency", help="comma-separated levels instead of the scenario's")
    p.add_argument("--output-tokens", type=int, help="chunks per streamed answer (streaming)")
    p.add_argument(
        "--requests", type=int, default=100_000, help="soak: requests in all (default 100000)"
    )
    p.add_argument("--upstream", choices=("sim", "fast"), default="sim",
                   help="throughput/overhead: the engine simulator (default) or the fixed-answer "
                        "Rust upstream (non-streamed scenarios only), which leaves the CPU to the "
                        "gateways and the load generator")
    p.add_argument("--pin", action="store_true",
                   help="keep the load generator and llmgw-keys' control plane on the first CPU, "
                        "the upstream and the gateways on the others (default: the scheduler "
                        "places every thread)")
    p.add_argument("--gateway-workers", type=int, default=1, metavar="N",
                   help="workers of each llmgw gateway, plain and keyed (default 1: the interpreter "
                        "thread of one worker bounds it; the machine's CPU count fills the machine)")
    p.add_argument("--base", metavar="REV",
                   help="throughput/overhead: also run llmgw's gateway from git revision REV's python/ "
                        "(target llmgw-base, this build's Rust core; refused when rust/ differs), "
                        "for a before/after measured in the same rounds")
    p.add_argument("--rate", type=float,
                   help="keyed-cost: requests per second to each gateway (default 2500)")
    p.add_argument("--out", help="result path (default bench/results/SCENARIO-DATE-HOST.json)")
    p.add_argument("--users", type=int, help="routing: chat users (default 64)")
    p.add_argument("--turns", type=int, help="routing: mean turns per user (default 6, +-4)")
    p.add_argument(
        "--tenant-skew",
        type=float,
        help="routing: Zipf exponent of system-prompt popularity (default 1; 0: equal groups)",
    )
    p.add_argument("--replicas", type=int, help="routing: simulator replicas (default 4)")
    p.add_argument("--cache-blocks", type=int, help="routing: prefix-cache blocks per replica")


def run_scenario(args: argparse.Namespace) -> int:
    """Runs one scenario end to end and writes its result; returns the exit status."""
    sc = SCENARIOS[args.scenario]
    if sc.own is not None:
        return int(load(sc.own.run)(args))
    rounds = 2 if args.quick else args.rounds
    round_s = args.round_s or (1.0 if args.quick else sc.round_s)
    levels = (
        [int(x) for x in args.concurrency.split(",")]
        if args.concurrency
        else list(sc.concurrencies)
    )
    tokens = args.output_tokens or sc.output_tokens
    peer_names = [] if args.scenario == "soak" else [p for p in args.peers.split(",") if p]
    machine, started = machine_facts(), now_iso()
    code = git_state(str(ROOT))  # at start: the code the servers load
    if args.upstream == "fast" and args.scenario not in ("throughput", "overhead"):
        raise SystemExit(f"--upstream fast answers only non-streamed requests; the {args.scenario} "
                         "scenario needs the simulator (--upstream sim)")
    if args.gateway_workers < 1:
        raise SystemExit(f"--gateway-workers {args.gateway_workers}: a gateway needs at least one worker")
    stack = Stack(output_tokens=tokens, peer_names=peer_names, upstream=args.upstream,
                  gateway_workers=args.gateway_workers)
    base_git = ""
    if args.base:
        if args.scenario not in ("throughput", "overhead"):
            raise SystemExit(f"--base compares plain gateways in the throughput and overhead scenarios, "
                             f"not in {args.scenario}")
        try:
            stack.base = export(ROOT, args.base, stack.workdir / "base")
        except BaseError as e:
            raise SystemExit(f"bench: {e}") from None
        base_git = stack.base[1][:12]
    figures: dict[str, float | None] = {}
    pinned = ""
    try:
        stack.start()
        if args.pin:
            pinned = stack.pin_layout()
        live = stack.live()
        if args.scenario == "soak":
            all_rounds = _soak(stack, args.requests, levels[0], figures)
            order = ["llmgw"]
        else:
            plan = schedule(live, levels, rounds)
            if stack.keyed is not None and KEYED in live:
                stack.keyed.start_cpu()
            all_rounds = run_rounds(
                stack, plan, round_s=round_s, stream=sc.stream, max_tokens=tokens
            )
            order = live
            if stack.keyed is not None and KEYED in live:
                # Before stopping: exact usage means every 200 the gateway answered is counted.
                figures.update(stack.keyed.usage_check())
    finally:
        stack.stop()
    machine.loadavg_end = list(os.getloadavg())
    summary = fold(all_rounds, order)
    void, why = (False, "") if args.scenario == "soak" else void_check(summary)
    if args.scenario != "soak":
        figures.update(_figures(args.scenario, all_rounds, summary, levels))
    res = Result(
        scenario=args.scenario,
        date=today(),
        started_at=started,
        finished_at=now_iso(),
        command=command(args),
        machine=machine,
        versions={
            **versions("llmgw", "granian", "uvloop", "httptools", "msgspec"),
            "llmgw_git": code,
            **({"llmgw_base_git": base_git} if base_git else {}),
        },
        settings={
            "rounds": rounds,
            "round_s": round_s,
            "concurrency": levels,
            "stream": sc.stream,
            "output_tokens": tokens,
            "sim_workers": stack.sim_workers,
            "gateway_workers": stack.gateway_workers,
            "requests": args.requests if args.scenario == "soak" else 0,
            "quick": args.quick,
            "pinned": pinned,
        },
        targets=stack.targets,
        rounds=all_rounds,
        summary=summary,
        void=void,
        void_reason=why,
        figures=figures,
    )
    out = Path(args.out) if args.out else result_path(args.scenario, res.date, res.machine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(summary_table(res))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _figures(
    name: str, rounds: list[Round], summary: list[Row], levels: list[int]
) -> dict[str, float | None]:
    """The headline figures: added µs over direct (paired by round), and ratios to vllm-router."""
    gws = sorted({r.target for r in rounds if r.target != DIRECT})
    out: dict[str, float | None] = {}
    c = levels[0]
    if name == "overhead":
        for g in gws:
            out[f"{g}_added_p50_us"] = paired_added(rounds, g, "latency_p50", c)
            out[f"{g}_added_p99_us"] = paired_added(rounds, g, "latency_p99", c)
    elif name == "streaming":
        for g in gws:
            out[f"{g}_added_ttft_p50_us"] = paired_added(rounds, g, "ttft_p50", c)
            out[f"{g}_added_per_chunk_us"] = paired_added(rounds, g, "gap_mean", c)
    elif name == "throughput":
        by = {(r.target, r.concurrency): r for r in summary}
        for lvl in levels:
            a, b = by.get(("llmgw", lvl)), by.get(("vllm-router", lvl))
            if a and b and b.rps["median"] > 0:
                out[f"llmgw_over_vllm_router_rps_c{lvl}"] = a.rps["median"] / b.rps["median"]
                out[f"llmgw_minus_vllm_router_p99_ms_c{lvl}"] = (
                    a.p99_ms["median"] - b.p99_ms["median"]
                )
            # CPU per request (µs), the median over rounds of each round's CPU / req/s: what
            # the gateway spends whatever the wall rate a busy machine let it reach; and the
            # same for its busiest thread (the interpreter's), the steadier of the two figures.
            for g in ("llmgw", KEYED, BASE):
                for field, figure in (("server_cpu", "gateway_cpu_us"), ("server_busiest", "busiest_thread_us")):
                    per = [getattr(r, field) / r.result.rps * 1e6 for r in rounds
                           if r.target == g and r.concurrency == lvl and getattr(r, field)
                           and r.result.rps > 0]
                    if per:
                        out[f"{g.replace('-', '_')}_{figure}_c{lvl}"] = statistics.median(per)
                # What the kernel says of that thread, per request (medians over rounds): time
                # it waited for a CPU, time in the kernel, and context switches, voluntary
                # (it had nothing to do) and imposed; a slow round's cause is among these.
                # The machine's idle cores while this gateway ran: near 0, the two cores were full;
                # well above, one thread (the interpreter's) set the rate.
                idle = [r.machine["idle"] for r in rounds
                        if r.target == g and r.concurrency == lvl and r.machine is not None]
                if idle:
                    out[f"{g.replace('-', '_')}_machine_idle_cores_c{lvl}"] = statistics.median(idle)
                kern = [(r.server_busiest_kernel, r.result.ok) for r in rounds
                        if r.target == g and r.concurrency == lvl and r.server_busiest_kernel and r.result.ok]
                for key, figure, scale in (("wait_ns", "wait_us", 1e-3), ("sys_ticks", "sys_us", 1e6 / TICK),
                                           ("voluntary", "voluntary_per_kreq", 1e3),
                                           ("involuntary", "involuntary_per_kreq", 1e3)):
                    if kern:
                        out[f"{g.replace('-', '_')}_busiest_{figure}_c{lvl}"] = statistics.median(
                            k[key] * scale / ok for k, ok in kern)
            # Cores the hypervisor took during this level's rounds (every target): a run with
            # steal measured a host that others were using too.
            steal = [r.machine["steal"] for r in rounds if r.concurrency == lvl and r.machine is not None]
            if steal:
                out[f"machine_steal_cores_median_c{lvl}"] = statistics.median(steal)
                out[f"machine_steal_cores_max_c{lvl}"] = max(steal)
            # The target: keys, limits and usage on cost at most 10% (rps ratio >= 0.9).
            _side_by_side(out, rounds, by, KEYED, "llmgw", lvl)
            # --base: today's gateway over the same gateway at another commit.
            _side_by_side(out, rounds, by, "llmgw", BASE, lvl)
    return out


def _side_by_side(out: dict[str, float | None], rounds: list[Round], by: dict[tuple[str, int], Row],
                  name: str, base: str, lvl: int) -> None:
    """`name` over `base` at level `lvl`, when both ran: the ratio of their medians (req/s,
    p50, p99), each round's own req/s ratio and a 95% interval of the first."""
    a, k = by.get((base, lvl)), by.get((name, lvl))
    if not (a and k and a.rps["median"] > 0):
        return
    key = f"{name}_over_{base}".replace("-", "_")
    out[f"{key}_rps_c{lvl}"] = k.rps["median"] / a.rps["median"]
    out[f"{key}_p50_c{lvl}"] = k.p50_ms["median"] / a.p50_ms["median"]
    out[f"{key}_p99_c{lvl}"] = k.p99_ms["median"] / a.p99_ms["median"]
    # Beside it, each round's own ratio (the two ran one after the other): the median and
    # the spread, which says how much one run's ratio can move.
    pairs = rps_pairs(rounds, name, base, lvl)
    paired = paired_rps_ratio(pairs)
    if paired is not None:
        for stat in ("median", "min", "max"):
            out[f"{key}_rps_paired_{stat}_c{lvl}"] = paired[stat]
    # And where the ratio of medians lies, from this run's rounds alone: a 95% bootstrap
    # interval (`python -m bench pool` gives it over several runs).
    lo, hi = bootstrap_ratio([pairs])
    out[f"{key}_rps_ci95_lo_c{lvl}"] = lo
    out[f"{key}_rps_ci95_hi_c{lvl}"] = hi


def _soak(stack: Stack, total: int, c: int, figures: dict[str, float | None]) -> list[Round]:
    """Two halves of total/2 requests each against llmgw; RSS before, between and after."""
    gw = stack.servers["llmgw"]

    def pids_rss() -> float:
        # Re-listed each time: granian may have restarted a worker.
        return rss_bytes(group_pids(gw.pid)) / 2**20

    half = max(total // 2, 1)
    rss = [pids_rss()]
    out = []
    for i in (1, 2):
        spec = LoadSpec(url=gw.url, model=MODEL, concurrency=c, requests=half, timeout=30.0)
        with Sampler(gw.pid, every=1.0) as s:
            res = uvloop.run(run_load(spec, progress=True))
        rss.append(pids_rss())
        out.append(
            Round(
                round=i,
                target="llmgw",
                concurrency=c,
                stream=False,
                result=res,
                server_cpu=s.cpu,
                server_rss_mb=s.rss_max_mb,
                upstream_cpu=None,
            )
        )
        print(
            f"bench: soak half {i}: {res.ok:,} ok, {res.rps:,.0f} req/s, RSS {rss[-1]:.1f} MB",
            file=sys.stderr,
        )
    figures.update(
        {
            "rss_start_mb": rss[0],
            "rss_half_mb": rss[1],
            "rss_end_mb": rss[2],
            "growth_first_half_mb": rss[1] - rss[0],
            "growth_second_half_mb": rss[2] - rss[1],
            "requests": float(2 * half),
        }
    )
    return out
