"""`python -m bench run keyed-cost`: what keys, limits and usage cost per request, both gateways at once.

The throughput scenario's keyed/plain ratio moves by about ±0.05 from run to run on a shared
2-core VM. Each target's rounds run at different moments and the machine's speed changes
between them: plain llmgw alone ran anywhere from 16k to 22k req/s within one run. Here plain
llmgw and llmgw-keys take the same fixed rate in the same windows, so whatever slows the
machine slows both. Each window measures the CPU each part spent per request:

- each gateway's process group (schedstat nanoseconds, every thread);
- the keyed gateway's control plane (usage ingest, leases, snapshots, its idle loops);
- the rest of the machine (/proc/stat's busy time less the above): the load generator, the
  upstream and the kernel's threads. It is shared equally by the two gateways' requests, which
  are the same requests.

The headline is what keys, limits and usage add per request: the keyed gateway's CPU less
plain's, and the control plane's. `cost_ratio` is plain's machine CPU per request divided by
keyed's, at this rate. It is not the throughput scenario's ratio, which the 10% target is
judged by: at saturation each request costs the gateway less (on an Intel host, about
130 µs at c=32 against about 250 µs at 2,500 req/s: fewer wakeups per
request), while what keys add does not shrink with it, so the ratio there is lower. The
result gives medians over the windows with the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import msgspec
import uvloop

from bench.keyed import NAME as KEYED
from bench.load import LoadResult, LoadSpec, run_load
from bench.procs import TICK, busy_ticks, group_cpu_ns, machine_ticks
from bench.report import Result, Target, command, git_state, machine_facts, now_iso, result_path, today
from bench.runner import MODEL, ROOT, Stack
from bench.stats import median, spread

PLAIN = "llmgw"
RATE = 2500.0
"""Requests per second sent to each gateway: together about half of what this 2-core machine
serves, so neither gateway saturates and the rate is met in every window."""
CONCURRENCY = 16
"""Connections per gateway: enough to hold the rate (a request takes 1-3 ms here)."""


class Window(msgspec.Struct, kw_only=True):
    """CPU per request in one window, in µs (`cp_us` per keyed request)."""

    plain_us: float
    keyed_us: float
    cp_us: float
    shared_us: float
    """The rest of the machine, per request of either gateway."""
    cost_ratio: float
    """(plain_us + shared_us) / (keyed_us + cp_us + shared_us)."""
    plain: LoadResult
    keyed: LoadResult


class KeyedCostResult(Result, kw_only=True):
    """A `python -m bench run keyed-cost` result: the common fields plus each window."""

    windows: list[Window] = msgspec.field(default_factory=list)
    verdict: str = ""


def window(plain_ns: int, keyed_ns: int, cp_ns: int, machine_ns: int, plain: LoadResult,
           keyed: LoadResult) -> Window:
    """One window's costs from the CPU each part used during it (ns) and what each gateway answered."""
    shared = max(machine_ns - plain_ns - keyed_ns - cp_ns, 0) / (plain.ok + keyed.ok) / 1000
    p = plain_ns / plain.ok / 1000
    k = keyed_ns / keyed.ok / 1000
    c = cp_ns / keyed.ok / 1000
    return Window(plain_us=p, keyed_us=k, cp_us=c, shared_us=shared,
                  cost_ratio=(p + shared) / (k + c + shared), plain=plain, keyed=keyed)


def _machine_ns() -> int:
    """Busy CPU time of the whole machine so far (`bench.procs.busy_ticks`), in ns."""
    return busy_ticks(machine_ticks()) * 1_000_000_000 // TICK


def _void(w: Window, rate: float, seconds: float) -> str:
    for name, r in ((PLAIN, w.plain), (KEYED, w.keyed)):
        if r.errors:
            return f"{name} answered errors: {r.errors}"
        if r.ok < 0.95 * rate * seconds:
            return (f"{name} answered {r.ok} requests where {rate * seconds:.0f} were sent: the "
                    "machine could not hold the rate; run again with a lower --rate")
    return ""


def measure(stack: Stack, windows: int, seconds: float, rate: float) -> tuple[list[Window], str]:
    """Loads both gateways at `rate` for `windows` windows of `seconds`; the windows and why the
    run is void ('' when it is not)."""
    assert stack.keyed is not None
    gw = {n: stack.servers[n] for n in (PLAIN, KEYED)}
    cp = stack.keyed.server.pid

    def spec(name: str, duration: float) -> LoadSpec:
        return LoadSpec(url=gw[name].url, model=MODEL, concurrency=CONCURRENCY, duration=duration,
                        rate=rate, api_key=stack.api_keys.get(name, "bench"))

    async def both(duration: float) -> list[LoadResult]:
        return list(await asyncio.gather(run_load(spec(PLAIN, duration)), run_load(spec(KEYED, duration))))

    uvloop.run(both(2.0))  # warm: connections, the keyed worker's first leases
    out: list[Window] = []
    void = ""
    for i in range(windows):
        before = (group_cpu_ns(gw[PLAIN].pid), group_cpu_ns(gw[KEYED].pid), group_cpu_ns(cp), _machine_ns())
        plain, keyed = uvloop.run(both(seconds))
        # The keyed gateway posts the window's last usage within a quarter of a second; the
        # control plane's work on it belongs to this window.
        time.sleep(0.5)
        after = (group_cpu_ns(gw[PLAIN].pid), group_cpu_ns(gw[KEYED].pid), group_cpu_ns(cp), _machine_ns())
        d = [b - a for a, b in zip(before, after, strict=True)]
        w = window(d[0], d[1], d[2], d[3], plain, keyed)
        out.append(w)
        void = void or _void(w, rate, seconds)
        print(f"bench: [{i + 1}/{windows}] plain {w.plain_us:6.1f} µs  keyed {w.keyed_us:6.1f} µs  "
              f"control plane {w.cp_us:5.1f} µs  rest {w.shared_us:6.1f} µs  ratio {w.cost_ratio:.3f}",
              file=sys.stderr)
    return out, void


def figures(ws: list[Window]) -> dict[str, float | None]:
    """The headline figures: medians over the windows (and the ratio's spread)."""
    ratio = spread([w.cost_ratio for w in ws])
    return {
        "keyed_cost_ratio": round(ratio["median"], 3),
        "keyed_cost_ratio_min": round(ratio["min"], 3),
        "keyed_cost_ratio_max": round(ratio["max"], 3),
        "plain_gateway_us": round(median([w.plain_us for w in ws]), 2),
        "keyed_gateway_us": round(median([w.keyed_us for w in ws]), 2),
        "keyed_added_gateway_us": round(median([w.keyed_us - w.plain_us for w in ws]), 2),
        "control_plane_us": round(median([w.cp_us for w in ws]), 2),
        "shared_us": round(median([w.shared_us for w in ws]), 2),
    }


def run_keyed_cost(args: argparse.Namespace) -> int:
    """Starts the upstream and both gateways, measures, checks usage, writes the result."""
    windows = 2 if args.quick else args.rounds
    seconds = args.round_s or (1.0 if args.quick else 4.0)
    rate = args.rate or RATE
    if windows < 1 or seconds <= 0 or rate <= 0:
        print("bench: keyed-cost needs --rounds of 1 or more, and a positive --round-s and --rate",
              file=sys.stderr)
        return 2
    started, machine = now_iso(), machine_facts()
    code = git_state(str(ROOT))
    stack = Stack(upstream="fast", peer_names=[KEYED])
    try:
        stack.start()
        live = stack.live()
        if PLAIN not in live or KEYED not in live or stack.keyed is None:
            failed = "; ".join(f"{t.name}: {t.status}" for t in stack.targets if t.status != "ok")
            print(f"bench: keyed-cost needs both gateways running; {failed}", file=sys.stderr)
            return 1
        ws, void = measure(stack, windows, seconds, rate)
        usage = stack.keyed.usage_check()
        targets = list(stack.targets)
    finally:
        stack.stop()
    figs = figures(ws)
    figs.update(usage)
    if not void and usage["llmgw_keys_usage_exact"] != 1.0:
        void = (f"usage not exact: the control plane counted {usage['llmgw_keys_usage_counted']:.0f} "
                f"requests, the gateway answered {usage['llmgw_keys_gateway_ok']:.0f}")
    verdict = (f"keys, limits and usage added {figs['keyed_added_gateway_us']:.1f} µs of gateway CPU and "
               f"{figs['control_plane_us']:.1f} µs of control plane CPU per request at {rate:g} req/s per "
               f"gateway; cost ratio {figs['keyed_cost_ratio']:.3f} (windows {figs['keyed_cost_ratio_min']:.3f}–"
               f"{figs['keyed_cost_ratio_max']:.3f})" + (f"; VOID: {void}" if void else ""))
    res = KeyedCostResult(
        scenario="keyed-cost", date=today(), started_at=started, finished_at=now_iso(),
        command=command(args),
        machine=machine, versions={"llmgw_git": code, "python": sys.version.split()[0]},
        settings={"windows": windows, "window_s": seconds, "rate_per_gateway": rate,
                  "concurrency": CONCURRENCY, "quick": bool(args.quick)},
        targets=[Target(name=t.name, kind=t.kind, version=t.version, command=t.command, notes=t.notes)
                 for t in targets],
        rounds=[], summary=[], void=bool(void), void_reason=void, figures=figs, windows=ws,
        verdict=verdict,
    )
    res.machine.loadavg_end = list(os.getloadavg())
    print(markdown(res))
    out = Path(args.out) if args.out else result_path("keyed-cost", res.date, res.machine)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(f"\nwritten {out}")
    return 1 if void else 0


def markdown(res: KeyedCostResult) -> str:
    """The windows as a Markdown table, then the verdict."""
    lines = ["| window | plain µs | keyed µs | control plane µs | rest µs | cost ratio |",
             "|---|---|---|---|---|---|"]
    for i, w in enumerate(res.windows, 1):
        lines.append(f"| {i} | {w.plain_us:.1f} | {w.keyed_us:.1f} | {w.cp_us:.1f} | {w.shared_us:.1f} | "
                     f"{w.cost_ratio:.3f} |")
    return "\n".join([*lines, "", res.verdict])
