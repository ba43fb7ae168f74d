"""The `routing` scenario's result: per-round records, the maths, the checks and the tables.

The documents extend the harness's (`bench.report`): a RoutingResult is a Result
whose rounds and rows carry the cache figures too, so `python -m bench table`
and anything reading the common fields keeps working.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from bench.report import Result, Round, Row, _f, _spread
from bench.stats import spread

ORACLE = "oracle"
VLLM_ROUTER = "vllm-router"
POLICIES = ("round_robin", "least_load", "prefix", "kv")


def llmgw_target(policy: str) -> str:
    """The target name of llmgw running `policy`."""
    return f"llmgw-{policy}"


class RoutingRound(Round, kw_only=True):
    """One run of the whole workload through one target, on a cold fleet."""

    replica_requests: list[int]  # finished requests per replica (the replicas' own counters)
    prompt_tokens: int  # prefix-cache queries over all replicas, in tokens
    hit_tokens: int  # prefix-cache hits over all replicas, in tokens
    # Both are null in JSON when undefined (no query; a replica with no request: inf).
    hit_ratio: float | None
    imbalance: float | None  # busiest replica's requests / least busy one's
    route_kinds: dict[str, int] = msgspec.field(
        default_factory=dict
    )  # llmgw: decisions by kind, from its usage log
    mirror_hit_ratio: float | None = None  # oracle: what its mirrors predicted
    wall_s: float = 0.0  # the whole round: fleet start to fleet stop


class RoutingRow(Row, kw_only=True):
    """Median [min, max] over rounds of one target's cache figures, besides the load ones."""

    hit_ratio: dict[str, float | None]
    ttft_p90_ms: dict[str, float | None]
    imbalance: dict[str, float | None]


class Check(msgspec.Struct, kw_only=True):
    """One acceptance figure, measured against its target."""

    name: str
    value: float | None
    op: str  # ">=", "<=", ">"
    target: float
    met: bool | None  # None: not measured (a target missing)


class RoutingResult(Result, kw_only=True):
    """A `python -m bench run routing` result."""

    # Narrowed so that reading a file back gives the routing records, not their bases.
    rounds: list[RoutingRound]  # type: ignore[assignment]
    summary: list[RoutingRow]  # type: ignore[assignment]
    checks: list[Check] = msgspec.field(default_factory=list)


def imbalance(counts: Sequence[int]) -> float:
    """Busiest replica's requests over the least busy one's (inf when one got none, NaN if no data)."""
    if not counts or max(counts) == 0:
        return math.nan
    lo = min(counts)
    return math.inf if lo == 0 else max(counts) / lo


def cache_deltas(
    before: list[dict[str, float]], after: list[dict[str, float]]
) -> tuple[list[int], int, int]:
    """(requests per replica, prompt tokens queried, hit tokens) between two scrapes of a fleet."""

    def d(i: int, k: str) -> int:
        return int(after[i][k] - before[i][k])

    n = range(len(after))
    reqs = [d(i, "vllm:request_success_total") for i in n]
    queries = sum(d(i, "vllm:prefix_cache_queries_total") for i in n)
    hits = sum(d(i, "vllm:prefix_cache_hits_total") for i in n)
    return reqs, queries, hits


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def fold(rounds: list[RoutingRound], order: list[str]) -> list[RoutingRow]:
    """Median [min, max] over rounds, per target, in run order."""
    rows = []
    for name in order:
        rs = [r for r in rounds if r.target == name]
        if not rs:
            continue
        cpus = [r.server_cpu for r in rs if r.server_cpu is not None]
        rss = [r.server_rss_mb for r in rs if r.server_rss_mb is not None]
        rows.append(
            RoutingRow(
                target=name,
                concurrency=rs[0].concurrency,
                rounds=len(rs),
                rps=_s([r.result.rps for r in rs]),
                p50_ms=_s([_get(r.result.latency_ms, "p50") for r in rs]),
                p99_ms=_s([_get(r.result.latency_ms, "p99") for r in rs]),
                ttft_p50_ms=_s([_get(r.result.ttft_ms, "p50") for r in rs]),
                gap_mean_ms=_s([_nan(r.result.gap_mean_ms) for r in rs]),
                server_cpu=_s(cpus),
                rss_mb_max=max(rss) if rss else math.nan,
                errors=sum(sum(r.result.errors.values()) for r in rs),
                cut=sum(r.result.cut for r in rs),
                client_cpu=spread([r.result.client_cpu for r in rs])["median"],
                hit_ratio=_s([_nan(r.hit_ratio) for r in rs]),
                ttft_p90_ms=_s([_get(r.result.ttft_ms, "p90") for r in rs]),
                imbalance=_s_inf([math.inf if r.imbalance is None else r.imbalance for r in rs]),
            )
        )
    return rows


_BIG = 1e300


def _spread_inf(values: list[float]) -> dict[str, float]:
    """spread() where inf (a starved replica) counts as larger than any number, not as NaN."""
    # Linear interpolation would turn inf * 0 into NaN: stand inf in by a huge number.
    s = spread([_BIG if math.isinf(v) else v for v in values])
    return {k: math.inf if v >= _BIG / 10 else v for k, v in s.items()}


def _s(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {**spread(values)}
    return out


def _s_inf(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {**_spread_inf(values)}
    return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _get(d: dict[str, float | None], k: str) -> float:
    return _nan(d.get(k))


def _med(rows: dict[str, RoutingRow], target: str, field: str) -> float | None:
    row = rows.get(target)
    if row is None:
        return None
    v = getattr(row, field)["median"]
    return None if v is None or math.isnan(v) or math.isinf(v) else float(v)


def figures_and_checks(summary: list[RoutingRow]) -> tuple[dict[str, float | None], list[Check]]:
    """Per-target medians, and the target ratios (ratios of medians over rounds) with verdicts."""
    rows = {r.target: r for r in summary}
    figs: dict[str, float | None] = {}
    for r in summary:
        key = r.target.replace("-", "_")
        for field in ("hit_ratio", "ttft_p50_ms", "ttft_p90_ms", "rps", "imbalance"):
            figs[f"{key}_{field}"] = _med(rows, r.target, field)
    kv, pf, rr = llmgw_target("kv"), llmgw_target("prefix"), llmgw_target("round_robin")
    figs["kv_over_oracle_hit_ratio"] = ratio(
        _med(rows, kv, "hit_ratio"), _med(rows, ORACLE, "hit_ratio")
    )
    figs["prefix_over_oracle_hit_ratio"] = ratio(
        _med(rows, pf, "hit_ratio"), _med(rows, ORACLE, "hit_ratio")
    )
    figs["round_robin_over_kv_ttft_p90"] = ratio(
        _med(rows, rr, "ttft_p90_ms"), _med(rows, kv, "ttft_p90_ms")
    )
    figs["prefix_over_vllm_router_hit_ratio"] = ratio(
        _med(rows, pf, "hit_ratio"), _med(rows, VLLM_ROUTER, "hit_ratio")
    )
    figs["vllm_router_over_prefix_ttft_p90"] = ratio(
        _med(rows, VLLM_ROUTER, "ttft_p90_ms"), _med(rows, pf, "ttft_p90_ms")
    )
    want = [
        ("kv_over_oracle_hit_ratio", ">=", 0.95),
        ("prefix_over_oracle_hit_ratio", ">=", 0.85),
        ("round_robin_over_kv_ttft_p90", ">=", 5.0),
        ("llmgw_kv_imbalance", "<=", 1.3),
        ("llmgw_prefix_imbalance", "<=", 1.3),
        ("prefix_over_vllm_router_hit_ratio", ">", 1.0),
        ("vllm_router_over_prefix_ttft_p90", ">", 1.0),
    ]
    checks = [check(name, figs.get(name), op, target) for name, op, target in want]
    return figs, checks


def check(name: str, value: float | None, op: str, target: float) -> Check:
    """The verdict of one figure against its target."""
    if value is None:
        return Check(name=name, value=None, op=op, target=target, met=None)
    met = {">=": value >= target, "<=": value <= target, ">": value > target}[op]
    return Check(name=name, value=value, op=op, target=target, met=met)


def _sp(d: dict[str, float | None], digits: int) -> str:
    """Median [min-max]; a value that was inf (null once written) shows as inf."""
    if d.get("median") is None and d.get("max") is None:
        return "-"
    v = {k: math.inf if d.get(k) is None else d[k] for k in ("median", "min", "max")}
    return _spread(v, digits)


def _verdict(c: Check) -> str:
    return "not measured" if c.met is None else ("met" if c.met else "missed")


def table(res: RoutingResult) -> str:
    """The table printed at the end of the run: medians [min-max] over rounds."""
    lines = [
        f"bench routing  {res.date}  {res.machine.nproc} cores  {res.machine.cpu_model}",
        (
            f"{'target':<18} {'hit ratio':>20} {'TTFT p50 ms':>24} {'TTFT p90 ms':>24} "
            f"{'req/s':>18} {'imbalance':>18} {'err/cut':>8}"
        ),
    ]
    for r in res.summary:
        assert isinstance(r, RoutingRow)
        lines.append(
            f"{r.target:<18} {_sp(r.hit_ratio, 3):>20} {_sp(r.ttft_p50_ms, 1):>24} "
            f"{_sp(r.ttft_p90_ms, 1):>24} {_sp(r.rps, 1):>18} {_sp(r.imbalance, 2):>18} "
            f"{f'{r.errors}/{r.cut}':>8}"
        )
    for t in res.targets:
        if t.status != "ok":
            lines.append(f"{t.name}: {t.status}")
    for c in res.checks:
        lines.append(f"{c.name}: {_f(c.value)} (target {c.op} {c.target:g}): {_verdict(c)}")
    return "\n".join(lines)


def markdown(res: RoutingResult) -> str:
    """The result as bench/README.md shows it (`python -m bench table FILE`)."""
    out = [
        (
            f"**routing** ({res.date}, `{res.command}`, llmgw {res.versions.get('llmgw_git', '?')}, "
            f"{res.machine.nproc} cores, load average {res.machine.loadavg_start[0]:.1f} at start)"
        ),
        "",
        "| target | rounds | hit ratio | TTFT p50 ms | TTFT p90 ms | req/s | imbalance | errors/cut |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res.summary:
        assert isinstance(r, RoutingRow)
        cells = [
            r.target, str(r.rounds), _sp(r.hit_ratio, 3), _sp(r.ttft_p50_ms, 1),
            _sp(r.ttft_p90_ms, 1), _sp(r.rps, 1), _sp(r.imbalance, 2),
            f"{r.errors}/{r.cut}",
        ]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "| figure | measured | target | verdict |", "|---|---:|---:|---|"]
    for c in res.checks:
        out.append(f"| `{c.name}` | {_f(c.value)} | {c.op} {c.target:g} | {_verdict(c)} |")
    return "\n".join(out)
