"""`python -m bench run index`: the KV-event index's Rust bench, against its targets.

`cargo bench --bench index` (release profile; rust/benches/index.rs) ingests
vLLM-format event batches into one replica, looks 8k-token prompts up across 8
replicas, and prints one JSON object, with rates per CPU-second of its one
thread. This reads that object, checks it against the targets and
writes `bench/results/index-DATE-HOST.json` in the harness's result format. It
leaves `bench/results/kv_index.json` (the Rust bench's own committed output)
alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.report import Result, Target, _f, command, git_state, machine_facts, now_iso, result_path, today
from bench.routing_report import Check, check
from bench.runner import ROOT

INGEST_TARGET = 2_000_000.0  # block hashes ingested per second, one core
LOOKUP_TARGET = 500_000.0  # lookups of 8k-token prompts per second, one core
BYTES_TARGET = 64.0  # bytes per indexed block per replica


class IndexResult(Result, kw_only=True):
    """A `python -m bench run index` result: the common fields plus the bench's own output."""

    raw: dict[str, Any] = msgspec.field(default_factory=dict)
    checks: list[Check] = msgspec.field(default_factory=list)


def parse_output(stdout: str) -> dict[str, Any]:
    """The JSON object the bench printed (the last line that is one)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            doc: dict[str, Any] = json.loads(line)
            return doc
    raise ValueError("the index bench printed no JSON object")


def figures_and_checks(raw: dict[str, Any]) -> tuple[dict[str, float | None], list[Check]]:
    """The headline figures and their verdicts.

    Ingest must meet the target in both encodings, so the slower one is the figure.
    The bench times three kinds of 8k-token lookup; each is checked, since a
    gateway's prompts are of all three kinds. Each is timed on 64 prompts whose token ids
    are in cache, as they are right after tokenization; the streamed figure (the
    all-replicas lookups over 800 prompts read from memory) is reported beside them. Bytes
    per block is the worst of the fills measured.
    """

    def num(k: str) -> float | None:
        v = raw.get(k)
        return float(v) if isinstance(v, int | float) else None

    def worst(keys: list[str], pick: Any) -> float | None:
        vals = [v for k in keys if (v := num(k)) is not None]
        return pick(vals) if vals else None

    figs: dict[str, float | None] = {
        "ingest_blocks_per_s": worst(["ingest_blocks_per_s_map", "ingest_blocks_per_s_array"], min),
        "ingest_blocks_per_s_map": num("ingest_blocks_per_s_map"),
        "ingest_blocks_per_s_array": num("ingest_blocks_per_s_array"),
        "lookups_per_s_8k_hit_all_replicas": num("lookups_per_s_hit_all_replicas"),
        # The same lookups over 25 MB of prompts: also the time to read their
        # token ids from memory, which a just-tokenized prompt does not pay.
        "lookups_per_s_8k_hit_all_replicas_streamed": num(
            "lookups_per_s_hit_all_replicas_streamed"
        ),
        "lookups_per_s_8k_hit_one_replica": num("lookups_per_s_hit_one_replica"),
        "lookups_per_s_8k_miss": num("lookups_per_s_miss"),
        "bytes_per_block": worst(
            ["bytes_per_block_full", "bytes_per_block_mid", "lookup_index_bytes_per_block"], max
        ),
        "cpu_share": num("cpu_share"),
    }
    checks = [
        check("ingest_blocks_per_s", figs["ingest_blocks_per_s"], ">=", INGEST_TARGET),
        *(
            check(k, figs[k], ">=", LOOKUP_TARGET)
            for k in (
                "lookups_per_s_8k_hit_all_replicas",
                "lookups_per_s_8k_hit_one_replica",
                "lookups_per_s_8k_miss",
            )
        ),
        check("bytes_per_block", figs["bytes_per_block"], "<=", BYTES_TARGET),
    ]
    return figs, checks


def run_index(args: argparse.Namespace) -> int:
    """Builds and runs the Rust bench, writes the result; 1 when the bench fails."""
    cmd = ["cargo", "bench", "--bench", "index"]
    env = dict(os.environ)
    if args.quick:
        env["KV_BENCH_SCALE"] = "0.1"  # the bench's own switch for a quick look
    machine, started = machine_facts(), now_iso()
    code = git_state(str(ROOT))
    t0 = time.perf_counter()
    # Bounded: a cold release build (lto=fat) on 2 cores takes minutes, the bench about one.
    r = subprocess.run(
        cmd, cwd=ROOT / "rust", env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        print(f"bench index: `{shlex.join(cmd)}` failed with {r.returncode}", file=sys.stderr)
        return 1
    raw = parse_output(r.stdout)
    figures, checks = figures_and_checks(raw)
    machine.loadavg_end = list(os.getloadavg())
    res = IndexResult(
        scenario="index",
        date=today(),
        started_at=started,
        finished_at=now_iso(),
        command=command(args),
        machine=machine,
        versions={"llmgw_git": code, "rustc": _rustc()},
        settings={
            "bench_command": shlex.join(cmd),
            "scale": float(env.get("KV_BENCH_SCALE", "1")),
            "wall_s": round(wall, 1),
            "quick": bool(args.quick),
        },
        targets=[
            Target(
                name="kv_index",
                kind="in-process",
                version=code,
                command=cmd,
                notes="rust/benches/index.rs, release profile, one thread",
            )
        ],
        rounds=[],
        summary=[],
        void=False,
        void_reason="",
        figures=figures,
        raw=raw,
        checks=checks,
    )
    out = Path(args.out) if args.out else result_path("index", res.date, res.machine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(table(res))
    print(f"bench: wrote {out} ({wall:.0f} s, build included)", file=sys.stderr)
    return 0


def _rustc() -> str:
    try:
        r = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return "missing"
    return r.stdout.strip() or "missing"


def _verdict(c: Check) -> str:
    return "not measured" if c.met is None else ("met" if c.met else "missed")


def table(res: IndexResult) -> str:
    """The figures against their targets, as printed at the end of the run."""
    lines = [f"bench index  {res.date}  {res.machine.nproc} cores  {res.machine.cpu_model}"]
    for c in res.checks:
        lines.append(
            f"{c.name:<36} {_f(c.value, 0):>14}  target {c.op} {c.target:,.0f}: {_verdict(c)}"
        )
    lines.append(
        f"(rates per CPU-second of the bench thread; cpu_share {_f(res.figures.get('cpu_share'))})"
    )
    return "\n".join(lines)


def markdown(res: IndexResult) -> str:
    """The result as bench/README.md shows it."""
    out = [
        (
            f"**index** ({res.date}, `{res.command}` = `{res.settings.get('bench_command')}`, "
            f"llmgw {res.versions.get('llmgw_git', '?')}, {res.machine.nproc} cores, "
            f"load average {res.machine.loadavg_start[0]:.1f} at start)"
        ),
        "",
        "| figure | measured | target | verdict |",
        "|---|---:|---:|---|",
    ]
    for c in res.checks:
        out.append(f"| `{c.name}` | {_f(c.value, 0)} | {c.op} {c.target:,.0f} | {_verdict(c)} |")
    share = _f(res.figures.get("cpu_share"))
    out += [
        "",
        f"Rates per CPU-second of the bench's one thread (its share of wall time: {share}).",
    ]
    return "\n".join(out)
