"""Starting what a scenario needs, running interleaved rounds, and folding them into rows.

The stack is: the simulator in zero-latency mode (the upstream, 2 workers),
llmgw's gateway with one worker in front of it, and each peer in front of the
same simulator. All are started before the first round and stopped after the
last, so every round of every target runs against the same processes.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench import peers as peers_mod
from bench.base import NAME as BASE
from bench.base import env as base_env
from bench.keyed import NAME as KEYED
from bench.keyed import Keyed
from bench.load import LoadSpec, run_load
from bench.procs import Sampler, Server, free_port, machine_split, machine_ticks, pin_group
from bench.report import DIRECT, Round, Row, Target, versions
from bench.stats import ratio_spread, spread

MODEL = "sim-model"
ROOT = Path(__file__).resolve().parent.parent


def llmgw_bin(name: str = "llmgw") -> str:
    """The llmgw entry point of the interpreter running the bench."""
    return str(Path(sys.executable).parent / name)


@dataclass
class Stack:
    """The running upstream, gateways and peers, and what happened to each."""

    sim_workers: int = 2
    gateway_workers: int = 1
    """Workers of every llmgw gateway, plain and keyed alike (`--gateway-workers`)."""
    output_tokens: int = 16
    upstream: str = "sim"
    """`sim` (the Python engine simulator) or `fast` (rust/examples/fast_upstream.rs: one fixed,
    non-streamed answer, for the throughput scenario when the simulator is the bottleneck)."""
    peer_names: list[str] = field(default_factory=lambda: list(peers_mod.PEERS))
    targets: list[Target] = field(default_factory=list)
    servers: dict[str, Server] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llmgw-bench-")))
    keyed: Keyed | None = None
    base: tuple[Path, str] | None = None
    """(`python/` directory, commit) of `--base`: also run the plain gateway from there."""
    api_keys: dict[str, str] = field(default_factory=lambda: dict(peers_mod.API_KEYS))
    """The bearer token each target wants; others get `bench`."""

    def pin_layout(self) -> str:
        """Once started (`--pin`): this process (the load generator) and llmgw-keys' control
        plane on the first CPU, the upstream and every gateway on the others. Returns the
        layout in words ('' when there is one CPU: nothing to pin).

        Unpinned, the scheduler moves every thread between the CPUs as it likes, and where it
        puts llmgw-keys' control plane against the gateway's interpreter thread moved that
        gateway's cost per request by up to 10 µs from one run to the next on an Intel host
        (docs/benchmarks.md). Pinned, each gateway has the same CPUs, shared only with the
        upstream, as a gateway in production is not shared with its control plane.
        """
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return ""
        first, rest = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(0, first)
        for srv in self.servers.values():
            pin_group(srv.pid, rest)
        if self.keyed is not None:
            pin_group(self.keyed.server.pid, first)
        return (f"load generator and llmgw-keys' control plane on CPU {cpus[0]}; upstream and "
                f"gateways on CPUs {','.join(map(str, sorted(rest)))}")

    def start(self, with_llmgw: bool = True) -> None:
        """Starts the upstream, then llmgw, then each peer; a peer that fails is recorded, not fatal."""
        port = free_port()
        if self.upstream == "fast":
            sim_args, ready, notes = _fast_upstream(port)
        else:
            sim_args = [
                llmgw_bin(),
                "engine",
                "sim",
                "--port",
                str(port),
                "--workers",
                str(self.sim_workers),
                "--output-tokens",
                str(self.output_tokens),
            ]
            ready, notes = "llmgw-sim listening on", "llmgw engine sim, zero-latency mode"
        sim = Server("upstream", sim_args, port)
        self.servers[DIRECT] = sim
        sim.wait_ready(60, "/health", ready)
        self.targets.append(
            Target(
                name=DIRECT,
                kind="upstream",
                version=versions("llmgw")["llmgw"],
                command=sim_args,
                url=sim.url,
                notes=notes,
            )
        )
        if with_llmgw:
            self._start_gateway("llmgw", sim.url)
            if self.base is not None:
                path, commit = self.base
                self._start_gateway(BASE, sim.url, base_env(path),
                                    f"llmgw gateway from {commit[:12]}'s python/ (PYTHONPATH={path}), "
                                    "this build's Rust core")
        for name in self.peer_names:
            self._start_peer(name, sim.url)

    def _start_gateway(self, name: str, upstream: str, env: dict[str, str] | None = None,
                       notes: str = "") -> None:
        """A plain llmgw gateway (`gateway_workers` workers) in front of `upstream`, as the target `name`."""
        gport = free_port()
        gw_args = [llmgw_bin(), "gateway", "--endpoint", f"sim={upstream}={MODEL}", "--port", str(gport),
                   "--workers", str(self.gateway_workers)]
        t = Target(name=name, kind="gateway", version=versions("llmgw")["llmgw"], command=gw_args,
                   notes=notes)
        try:
            gw = Server(name, gw_args, gport, env=env)
            gw.wait_ready(60, "/health", "llmgw gateway listening on")
            self.servers[name] = gw
            t.url = gw.url
        except RuntimeError as e:
            t.status = f"start failed: {e}"
        self.targets.append(t)

    def _start_peer(self, name: str, upstream: str) -> None:
        if name == KEYED:
            self._start_keyed(upstream)
            return
        peer = peers_mod.PEERS[name]
        t = Target(name=name, kind="gateway", version=peer.version, command=[])
        self.targets.append(t)
        try:
            venv, notes = peers_mod.ensure(peer, self.log)
        except Exception as e:  # noqa: BLE001 - any install failure is reported, the run goes on
            venv, notes = None, f"install failed: {e}"
        if venv is None:
            t.status = notes
            return
        t.notes = notes or peers_mod.installed_note(peer)
        try:
            srv = peers_mod.start(peer, venv, upstream, MODEL, self.workdir)
        except (RuntimeError, OSError) as e:
            t.status = f"start failed: {str(e)[-600:]}"
            return
        t.command, t.url = srv.args, srv.url
        self.servers[name] = srv

    def _start_keyed(self, upstream: str) -> None:
        t = Target(
            name=KEYED,
            kind="gateway",
            version=versions("llmgw")["llmgw"],
            command=[],
            notes="llmgw gateway --control-plane: API key, rpm/tpm limits and usage on",
        )
        self.targets.append(t)
        try:
            self.keyed = Keyed(llmgw_bin(), upstream, MODEL, self.workdir, self.gateway_workers)
        except (RuntimeError, OSError) as e:
            t.status = f"start failed: {str(e)[-600:]}"
            return
        assert self.keyed.gateway is not None
        t.command, t.url = self.keyed.gateway_args, self.keyed.gateway.url
        t.notes += "; control plane: " + shlex.join(self.keyed.server_args)
        self.servers[KEYED] = self.keyed.gateway
        self.api_keys[KEYED] = self.keyed.key

    def live(self) -> list[str]:
        """Names of the targets that are up, direct first."""
        return [t.name for t in self.targets if t.status == "ok" and t.name in self.servers]

    def stop(self) -> None:
        """Stops everything, peers first and the upstream last."""
        for name in reversed(list(self.servers)):
            if name == KEYED and self.keyed is not None:
                self.keyed.stop()  # the gateway, then its control plane
            else:
                self.servers[name].stop()
        self.servers.clear()


def schedule(
    targets: list[str], concurrencies: list[int], rounds: int
) -> list[tuple[int, int, str]]:
    """(concurrency, round, target) in the order run: every target once per round (A B A B ...)."""
    return [(c, r, t) for c in concurrencies for r in range(1, rounds + 1) for t in targets]


def run_rounds(
    stack: Stack,
    plan: list[tuple[int, int, str]],
    *,
    round_s: float,
    stream: bool,
    max_tokens: int,
    warmup_s: float = 0.5,
) -> list[Round]:
    """Runs the plan; each round is one time-bounded load against one target, sampled from /proc."""
    out: list[Round] = []
    up = stack.servers[DIRECT]
    warmed: set[str] = set()
    for i, (c, r, name) in enumerate(plan, 1):
        srv = stack.servers.get(name)
        if srv is None:
            continue
        # LiteLLM answers in ~0.1 s at best: let slow targets finish what they started.
        spec = LoadSpec(
            url=srv.url,
            model=MODEL,
            concurrency=c,
            duration=round_s,
            stream=stream,
            max_tokens=max_tokens,
            timeout=30.0,
            api_key=stack.api_keys.get(name, "bench"),
        )
        if (
            name not in warmed
        ):  # first touch of a target (caches, JIT-less warm paths): not measured
            warmed.add(name)
            warm = {**_asdict(spec), "duration": warmup_s, "concurrency": min(c, 8), "grace": 1.0}
            uvloop.run(run_load(LoadSpec(**warm)))
        watched = name != DIRECT
        ticks, t0 = machine_ticks(), time.perf_counter()
        with Sampler(srv.pid, detail=watched) as s_gw, Sampler(up.pid) as s_up:
            res = uvloop.run(run_load(spec))
        machine = machine_split(ticks, machine_ticks(), time.perf_counter() - t0)
        out.append(
            Round(
                round=r,
                target=name,
                concurrency=c,
                stream=stream,
                result=res,
                server_cpu=s_gw.cpu if watched else None,
                server_rss_mb=s_gw.rss_max_mb if watched else None,
                upstream_cpu=s_up.cpu,
                server_busiest=s_gw.busiest if watched else None,
                server_busiest_kernel=None if s_gw.busiest_delta is None else s_gw.busiest_delta._asdict(),
                machine=machine,
            )
        )
        errs = sum(res.errors.values())
        print(
            f"bench: [{i}/{len(plan)}] c={c:<4} round {r} {name:<14} {res.rps:>9,.0f} req/s  "
            f"p50 {res.latency_ms['p50']:.3f} ms  p99 {res.latency_ms['p99']:.3f} ms"
            + (f"  {errs} errors" if errs else "")
            # Worth a look only when the hypervisor took a tenth of a core or more.
            + (f"  steal {machine['steal']:.2f} cores" if machine["steal"] >= 0.1 else ""),
            file=sys.stderr,
        )
    return out


def _asdict(spec: LoadSpec) -> dict[str, object]:
    import msgspec

    return msgspec.structs.asdict(spec)


def fold(rounds: list[Round], order: list[str]) -> list[Row]:
    """Median [min, max] over rounds, per (target, concurrency), in run order."""
    rows = []
    levels = sorted({r.concurrency for r in rounds})
    for c in levels:
        for name in order:
            rs = [r for r in rounds if r.target == name and r.concurrency == c]
            if not rs:
                continue
            cpus = [r.server_cpu for r in rs if r.server_cpu is not None]
            rss = [r.server_rss_mb for r in rs if r.server_rss_mb is not None]
            rows.append(
                Row(
                    target=name,
                    concurrency=c,
                    rounds=len(rs),
                    rps=spread([r.result.rps for r in rs]),
                    p50_ms=spread([r.result.latency_ms["p50"] for r in rs]),
                    p99_ms=spread([r.result.latency_ms["p99"] for r in rs]),
                    ttft_p50_ms=spread([r.result.ttft_ms.get("p50", math.nan) for r in rs]),
                    gap_mean_ms=spread([r.result.gap_mean_ms for r in rs]),
                    server_cpu=spread(cpus) if cpus else spread([]),
                    rss_mb_max=max(rss) if rss else math.nan,
                    errors=sum(sum(r.result.errors.values()) for r in rs),
                    cut=sum(r.result.cut for r in rs),
                    client_cpu=spread([r.result.client_cpu for r in rs])["median"],
                )
            )
    return rows


def _pairs(rounds: list[Round], name: str, base: str, c: int) -> list[tuple[Round, Round]]:
    """(name's round, base's round) for each round in which both ran at concurrency c."""
    at = {(x.round, x.target): x for x in rounds if x.concurrency == c}
    return [(at[r, name], at[r, base]) for r in sorted({r for r, _ in at})
            if (r, name) in at and (r, base) in at]


def paired_added(rounds: list[Round], name: str, key: str, c: int) -> float | None:
    """Median over rounds of (target's figure - direct's figure in the same round), in µs.

    Pairing by round cancels most of the machine's drift between rounds.
    """
    diffs = [(_figure(t, key) - _figure(d, key)) * 1000 for t, d in _pairs(rounds, name, DIRECT, c)]
    med = spread(diffs)["median"]
    return None if math.isnan(med) else med


def paired_rps_ratio(pairs: list[tuple[float, float]]) -> dict[str, float] | None:
    """Median, min and max over `rps_pairs` of each round's own ratio.

    The spread a ratio of the two medians does not show: how far one round's pair moves
    on this machine. None when no round has both.
    """
    return ratio_spread(pairs) if any(b > 0 for _, b in pairs) else None


def rps_pairs(rounds: list[Round], name: str, base: str, c: int) -> list[tuple[float, float]]:
    """(name's req/s, base's req/s) of each round in which both ran at concurrency c."""
    return [(t.result.rps, b.result.rps) for t, b in _pairs(rounds, name, base, c)]


def _figure(r: Round, key: str) -> float:
    res = r.result
    if key == "gap_mean":
        return res.gap_mean_ms
    kind, p = key.split("_")  # e.g. "latency_p50", "ttft_p50"
    return {"latency": res.latency_ms, "ttft": res.ttft_ms}[kind].get(p, math.nan)


def wait_quiet(max_load: float = 1.0, max_wait: float = 0.0) -> None:
    """Optionally waits (up to max_wait s) for the 1-minute load average to fall under max_load."""
    import os

    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)


def _fast_upstream(port: int) -> tuple[list[str], str, str]:
    """Builds (once; cargo is incremental) and names the fixed-answer upstream."""
    subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "fast_upstream"],
                   cwd=ROOT, check=True)
    binary = ROOT / "target" / "release" / "examples" / "fast_upstream"
    return ([str(binary), str(port)], "llmgw-fast-upstream listening on",
            "rust/examples/fast_upstream.rs: a fixed non-streamed answer, std Rust, simulated")
