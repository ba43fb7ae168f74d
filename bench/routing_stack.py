"""What the `routing` scenario starts: simulator replicas with a prefix cache, and a front.

Every (round, target) gets a fresh fleet, so each target starts with cold
caches; the front (llmgw with one policy, or vllm-router) is started after the
fleet and stopped before it.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench import peers as peers_mod
from bench.procs import Server, free_port
from bench.runner import ROOT, llmgw_bin
from bench.workload import MODEL

TOKENIZER = str(ROOT / "rust" / "tests" / "fixtures" / "tiny-bpe")


@dataclass(frozen=True)
class FleetSpec:
    """The replicas' settings: prefill costs per uncached token, and the cache is bounded."""

    replicas: int = 4
    prefill_us_per_token: float = 200.0
    ttft_ms: float = 5.0
    itl_ms: float = 2.0
    output_tokens: int = 16
    block_size: int = 16
    cache_blocks: int = 1536
    max_num_seqs: int = 8
    tokenizer: str = TOKENIZER


@dataclass
class Replica:
    """One started simulator and its KV-event endpoints."""

    server: Server
    events: str
    replay: str

    @property
    def port(self) -> int:
        return self.server.port


def sim_args(spec: FleetSpec, port: int, events: str, replay: str) -> list[str]:
    """The command line of one replica."""
    return [
        llmgw_bin(), "engine", "sim", "--port", str(port), "--model", MODEL,
        "--prefill-us-per-token", str(spec.prefill_us_per_token),
        "--ttft-ms", str(spec.ttft_ms), "--itl-ms", str(spec.itl_ms),
        "--output-tokens", str(spec.output_tokens), "--block-size", str(spec.block_size),
        "--cache-blocks", str(spec.cache_blocks), "--max-num-seqs", str(spec.max_num_seqs),
        "--tokenizer", spec.tokenizer,
        "--kv-events-endpoint", events, "--kv-replay-endpoint", replay,
    ]  # fmt: skip


@dataclass
class Fleet:
    """N replicas, started together (cold caches) and stopped together."""

    spec: FleetSpec
    replicas: list[Replica] = field(default_factory=list)

    def start(self) -> None:
        """Starts every replica, then waits for all (they start in parallel)."""
        for i in range(self.spec.replicas):
            port = free_port()
            ev, rp = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            srv = Server(f"sim{i}", sim_args(self.spec, port, ev, rp), port)
            self.replicas.append(Replica(srv, ev, rp))
        try:
            for r in self.replicas:
                r.server.wait_ready(60, "/health", "llmgw-sim listening on")
        except RuntimeError:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [r.server.url for r in self.replicas]

    @property
    def ports(self) -> list[int]:
        return [r.port for r in self.replicas]

    def scrape(self) -> list[dict[str, float]]:
        """Each replica's counters that the scenario reads."""
        return [scrape(r.port) for r in self.replicas]

    def stop(self) -> None:
        for r in self.replicas:
            r.server.stop()
        self.replicas.clear()


COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "llmgw_sim_requests_aborted_total",
)


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the counters in COUNTERS over their label sets, from Prometheus text."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def scrape(port: int) -> dict[str, float]:
    """One replica's counters (loopback only)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse_metrics(r.read().decode())


def gateway_config(fleet: Fleet, policy: str, usage_log: Path) -> dict[str, object]:
    """server.yaml (as JSON) for llmgw with `policy` over the fleet.

    Only `kv` is given the KV-event endpoints and the tokenizer: the other policies
    do not use them, and subscribing would cost the gateway CPU they do not need.
    """
    kv = policy == "kv"
    endpoints = []
    for i, r in enumerate(fleet.replicas):
        ep: dict[str, object] = {"id": f"r{i}", "url": r.server.url, "models": [MODEL]}
        if kv:
            ep |= {"kv_events": r.events, "kv_replay": r.replay}
        endpoints.append(ep)
    routing: dict[str, object] = {"policy": policy}
    if kv:
        routing["tokenizer"] = fleet.spec.tokenizer
    return {
        "gateway": {
            "endpoints": endpoints,
            "kv_block_size": fleet.spec.block_size,
            "usage_log": str(usage_log),
            "routing": {MODEL: routing},
        }
    }


def start_llmgw(fleet: Fleet, policy: str, workdir: Path) -> tuple[Server, Path]:
    """llmgw's gateway (one worker) with `policy`; returns it and its usage log."""
    usage = workdir / f"usage-{policy}-{free_port()}.jsonl"
    cfg = workdir / f"server-{policy}.yaml"
    cfg.write_text(json.dumps(gateway_config(fleet, policy, usage)))  # JSON is YAML
    port = free_port()
    args = [llmgw_bin(), "gateway", "--config", str(cfg), "--port", str(port), "--workers", "1"]
    srv = Server(f"llmgw-{policy}", args, port)
    try:
        srv.wait_ready(60, "/health", "llmgw gateway listening on")
    except RuntimeError:
        srv.stop()
        raise
    return srv, usage


VLLM_ROUTER_POLICY = "cache_aware"


def start_vllm_router(fleet: Fleet, venv: Path, workdir: Path) -> Server:
    """vllm-router over the fleet with `--policy cache_aware` (its default, named to be sure)."""
    port = free_port()
    args = [
        str(venv / "bin" / "vllm-router"), "--worker-urls", *fleet.urls,
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-port", str(free_port()), "--policy", VLLM_ROUTER_POLICY,
    ]  # fmt: skip
    srv = Server("vllm-router", args, port, cwd=str(workdir))
    try:
        srv.wait_ready(90, peers_mod.HEALTH["vllm-router"])
    except RuntimeError:
        srv.stop()
        raise
    return srv


def route_kinds(usage_log: Path) -> dict[str, int]:
    """How many of llmgw's decisions were of each kind (cache_hit, cache_miss, guard, ...)."""
    out: dict[str, int] = {}
    if not usage_log.exists():
        return out
    for line in usage_log.read_text().splitlines():
        try:
            route = json.loads(line).get("route") or {}
        except json.JSONDecodeError:
            continue
        kind = str(route.get("kind", "?"))
        out[kind] = out.get(kind, 0) + 1
    return out
