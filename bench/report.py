"""Result documents (msgspec Structs, written as JSON), tables, the void rule, machine facts."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path

import msgspec

from bench.load import LoadResult, LoadSpec

DIRECT = "direct"
VOID_FACTOR = 3.0  # the void rule (docs/benchmarks.md): direct must reach 3x the best gateway


class Machine(msgspec.Struct, kw_only=True):
    """Where a result was measured: only ratios from one machine and run compare."""

    nproc: int
    cpu_model: str
    python: str
    platform: str
    loadavg_start: list[float]
    loadavg_end: list[float] = []
    clocksource: str = ""
    """The kernel's clock source: where it cannot serve clock reads in user space (some VMs'),
    each read is a system call, and the keyed path reads the clock more than the plain one."""
    threads_per_core: int = 0
    """CPU 0's SMT siblings (itself included): 2 when the two vCPUs may share one core."""
    cpu_flags: list[str] = []
    """Of the CPU's flags, those that move the figures: SHA and AVX extensions, TSC stability."""
    preload: str = ""
    """LD_PRELOAD when the run started: every process the bench starts inherits it, so a shim
    that changes what the system does (`bench/tools/sysclock.c`) is part of the result."""


class Target(msgspec.Struct, kw_only=True):
    """One thing load is sent to: the upstream itself (`direct`), llmgw or a peer."""

    name: str
    kind: str  # "upstream" | "gateway"
    version: str
    command: list[str]
    url: str = ""
    status: str = "ok"  # or "install failed: ..." / "start failed: ..."
    notes: str = ""


class Round(msgspec.Struct, kw_only=True):
    """One measured round against one target: every round is kept in the result."""

    round: int
    target: str
    concurrency: int
    stream: bool
    result: LoadResult
    server_cpu: float | None  # cores used by the target's process group (None: direct)
    server_rss_mb: float | None  # max RSS of the target's process group during the round
    upstream_cpu: float | None
    server_busiest: float | None = None
    """Cores used by the target's busiest thread (None: direct, or a result from before it)."""
    server_busiest_kernel: dict[str, int] | None = None
    """What the kernel counted for that thread over the round (`bench.procs.ThreadTimes`:
    run_ns, wait_ns, sys_ticks, user_ticks, voluntary, involuntary); None where not read."""
    machine: dict[str, float] | None = None
    """The whole machine over the round, in cores (`bench.procs.machine_split`: busy, idle,
    iowait, steal); None in results from before it was read."""


class Row(msgspec.Struct, kw_only=True):
    """Median and spread over the rounds of one (target, concurrency)."""

    target: str
    concurrency: int
    rounds: int
    rps: dict[str, float | None]  # {"median", "min", "max"}; null when no round measured it
    p50_ms: dict[str, float | None]
    p99_ms: dict[str, float | None]
    ttft_p50_ms: dict[str, float | None]
    gap_mean_ms: dict[str, float | None]
    server_cpu: dict[str, float | None]
    rss_mb_max: float | None
    errors: int
    cut: int
    client_cpu: float


class Result(msgspec.Struct, kw_only=True):
    """A whole `python -m bench run SCENARIO` result, as written to bench/results/."""

    scenario: str
    date: str
    started_at: str
    finished_at: str
    command: str
    machine: Machine
    versions: dict[str, str]
    settings: dict[str, bool | int | float | str | list[int]]
    targets: list[Target]
    rounds: list[Round]
    summary: list[Row]
    void: bool
    void_reason: str
    figures: dict[str, float | None]  # the scenario's headline figures (added µs, ratios, MB)


def machine_facts() -> Machine:
    """nproc, CPU model, Python and the load average now."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    siblings = _read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    return Machine(
        nproc=os.cpu_count() or 0,
        cpu_model=model,
        python=sys.version.split()[0],
        platform=platform.platform(),
        loadavg_start=list(os.getloadavg()),
        clocksource=_read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        threads_per_core=_cpu_count(siblings),
        cpu_flags=sorted(flags & _FLAGS_OF_NOTE),
        preload=os.environ.get("LD_PRELOAD", ""),
    )


_FLAGS_OF_NOTE = {"sha_ni", "avx2", "avx512f", "constant_tsc", "nonstop_tsc", "tsc_known_freq", "hypervisor"}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cpu_count(cpu_list: str) -> int:
    """How many CPUs a kernel CPU list names ("0", "0-1", "0,2"); 0 for none."""
    n = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1 if lo.isdigit() and (hi or lo).isdigit() else 0
    return n


def versions(*dists: str) -> dict[str, str]:
    """Installed versions of the given distributions in this interpreter."""
    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = "missing"
    return out


def git_state(root: str) -> str:
    """The commit the measured code came from, `+dirty` when the tree had changes."""
    import subprocess

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", root, *a], check=False, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "python", "rust")
    return head + ("+dirty" if dirty else "")


def void_check(summary: list[Row]) -> tuple[bool, str]:
    """The void rule, per concurrency level: direct req/s >= 3x the best gateway's.

    A level with no direct figure, or no gateway figure, cannot be checked and is void; so
    is one where a target answered nothing but errors (a broken build measures nothing).
    """
    reasons = []
    for c in sorted({r.concurrency for r in summary}):
        rows = [r for r in summary if r.concurrency == c]
        reasons += [f"c={c}: {r.target} answered only errors ({r.errors:,})"
                    for r in rows if r.errors and not r.rps["median"]]
        direct = [r.rps["median"] for r in rows if r.target == DIRECT]
        gws = [
            r.rps["median"] for r in rows if r.target != DIRECT and not math.isnan(r.rps["median"])
        ]
        if not direct or not gws:
            reasons.append(f"c={c}: nothing to compare")
            continue
        best = max(gws)
        if direct[0] < VOID_FACTOR * best:
            reasons.append(
                f"c={c}: direct {direct[0]:,.0f} req/s < {VOID_FACTOR:g}x best gateway {best:,.0f}"
            )
    return bool(reasons), "; ".join(reasons)


def command(args: argparse.Namespace) -> str:
    """The command line that made a result: the arguments `bench.__main__.main` parsed (its
    `argv` when called from Python, as the tests do), after this interpreter's `-m bench`."""
    argv = getattr(args, "argv", None)
    return shlex.join([os.path.basename(sys.executable), "-m", "bench",
                       *(sys.argv[1:] if argv is None else argv)])


def today() -> str:
    return dt.date.today().isoformat()


RESULTS = Path(__file__).resolve().parent / "results"
"""Where results are committed (`python -m bench table` summarizes them in bench/RESULTS.md)."""


def host_kind(cpu_model: str) -> str:
    """The CPU's maker in one word ("amd", "intel"), as result names and bench/RESULTS.md
    carry it: absolute figures compare only between hosts of one kind. "" when unknown."""
    model = cpu_model.lower()
    for kind in ("amd", "intel"):
        if kind in model:
            return kind
    words = re.findall(r"[a-z0-9]+", model)
    return words[0] if words else ""


def result_path(scenario: str, date: str, machine: Machine, folder: Path = RESULTS) -> Path:
    """`folder/SCENARIO-DATE-HOST.json`, with `-2`, `-3`... when that day already has one."""
    stem = f"{scenario}-{date}-{host_kind(machine.cpu_model) or 'unknown'}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _nan(x: float | None) -> bool:
    return x is None or math.isnan(x)


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def load_table(spec: LoadSpec, r: LoadResult) -> str:
    """The end-of-run table of `python -m bench load`."""
    lines = [
        f"{spec.url}  model={spec.model}  c={spec.concurrency}  stream={spec.stream}",
        f"  requests ok   {r.ok:>12,}   in {r.duration_s:.2f} s",
        f"  requests/s    {r.rps:>12,.1f}",
        (
            f"  latency ms    p50 {_f(r.latency_ms['p50'], 3)}  p90 {_f(r.latency_ms['p90'], 3)}  "
            f"p99 {_f(r.latency_ms['p99'], 3)}"
        ),
    ]
    if spec.stream:
        lines += [
            (
                f"  TTFT ms       p50 {_f(r.ttft_ms['p50'], 3)}  p90 {_f(r.ttft_ms['p90'], 3)}  "
                f"p99 {_f(r.ttft_ms['p99'], 3)}"
            ),
            (
                f"  chunk gap ms  mean {_f(r.gap_mean_ms, 4)}  p50 {_f(r.gap_ms['p50'], 4)}  "
                f"p99 {_f(r.gap_ms['p99'], 4)}"
            ),
            f"  chunks/s      {r.chunks_per_s:>12,.0f}   ({r.chunks:,} content events)",
        ]
    errs = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "none"
    lines += [f"  errors        {errs}", f"  client CPU    {r.client_cpu:.2f} cores"]
    return "\n".join(lines)


def _spread(d: dict[str, float | None], digits: int = 2) -> str:
    if _nan(d["median"]):
        return "-"
    return f"{d['median']:,.{digits}f} [{d['min']:,.{digits}f}-{d['max']:,.{digits}f}]"


def summary_table(res: Result) -> str:
    """The table printed at the end of `python -m bench run`: medians [min-max] over rounds."""
    stream = bool(res.settings.get("stream"))
    head = f"{'target':<14} {'c':>4} {'req/s':>26} {'p50 ms':>22} {'p99 ms':>22}"
    head += f" {'TTFT p50 ms':>22} {'gap ms':>22}" if stream else ""
    head += f" {'CPU':>6} {'RSS MB':>7} {'errors':>6} {'cut':>5}"
    lines = [f"bench {res.scenario}  {res.date}  {res.machine.nproc} cores  {res.machine.cpu_model}"]
    if res.settings.get("pinned"):
        lines.append(f"pinned: {res.settings['pinned']}")
    lines.append(head)
    for r in res.summary:
        line = (
            f"{r.target:<14} {r.concurrency:>4} {_spread(r.rps, 0):>26} {_spread(r.p50_ms, 3):>22} "
            f"{_spread(r.p99_ms, 3):>22}"
        )
        if stream:
            line += f" {_spread(r.ttft_p50_ms, 3):>22} {_spread(r.gap_mean_ms, 4):>22}"
        line += (
            f" {_f(r.server_cpu['median']):>6} {_f(r.rss_mb_max, 0):>7} {r.errors:>6} {r.cut:>5}"
        )
        lines.append(line)
    for t in res.targets:
        if t.status != "ok":
            lines.append(f"{t.name}: {t.status}")
    for k, v in res.figures.items():
        lines.append(f"{k}: {_f(v) if v is not None else '-'}")
    if res.scenario == "soak":
        lines.append("void rule: not applicable (llmgw alone)")
    elif res.void:
        lines.append("VOID: " + res.void_reason)
    else:
        lines.append("valid: direct >= 3x the best gateway at every level")
    return "\n".join(lines)


def markdown(res: Result) -> str:
    """A result as the Markdown table bench/README.md shows (`python -m bench table FILE`)."""
    stream = bool(res.settings.get("stream"))
    out = [
        (
            f"**{res.scenario}** ({res.date}, `{res.command}`, llmgw {res.versions.get('llmgw_git', '?')}, "
            f"{res.machine.nproc} cores, load average {res.machine.loadavg_start[0]:.1f} at start)"
        ),
        "",
        "| target | c | req/s | p50 ms | p99 ms |"
        + (" TTFT p50 ms | chunk gap ms |" if stream else "")
        + " CPU | RSS MB | errors/cut |",
        "|---|---:|---:|---:|---:|" + ("---:|---:|" if stream else "") + "---:|---:|---:|",
    ]
    for r in res.summary:
        cells = [
            r.target,
            str(r.concurrency),
            _spread(r.rps, 0),
            _spread(r.p50_ms, 3),
            _spread(r.p99_ms, 3),
        ]
        if stream:
            cells += [_spread(r.ttft_p50_ms, 1), _spread(r.gap_mean_ms, 4)]
        cells += [_f(r.server_cpu["median"]), _f(r.rss_mb_max, 0), f"{r.errors}/{r.cut}"]
        out.append("| " + " | ".join(cells) + " |")
    if res.figures:
        out += ["", ", ".join(f"`{k}` {_f(v)}" for k, v in res.figures.items())]
    out += ["", f"Void: {res.void_reason}" if res.void else "Void rule: passed or not applicable."]
    return "\n".join(out)
