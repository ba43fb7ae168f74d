"""`python -m bench run usage`: usage ingestion into SQLite and PostgreSQL, side by side.

Gateways send batches of usage records (`wire.UsageBatch`, finals as rows) to the
control plane, which reads each post (`store.usage_post.from_json`, natively, or
msgspec where the scan declines) and stores it with `llmgw.store.usage.ingest`.
This does both in-process, with posts encoded as a busy gateway sends them, and
counts requests recorded per second of wall time and per CPU-second (this process,
SQLite's thread included, plus the PostgreSQL server processes serving it). Reading
the post is part of what is timed, as the control plane reads it. Two shapes:

- `final`: a request shorter than a batch interval: its open and final come in one
  batch, so only the final is written;
- `open+final`: every request's open arrives one batch before its final (the worst
  case: two writes per request).

Each runs with 1 and 2 batches in flight (2: two gateways shipping at once; on
SQLite they queue on its one writer). The target: at least 20,000 records/s
into each backend; the check uses the `open+final` shape with 2 batches in flight.
PostgreSQL gets a fresh database on the local server (`LLMGW_BENCH_PG`, default
postgresql://postgres@127.0.0.1:5432/test as the admin connection), dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from bench.report import (
    Result,
    Target,
    _f,
    command,
    git_state,
    machine_facts,
    now_iso,
    result_path,
    today,
    versions,
)
from bench.routing_report import Check, check
from bench.runner import ROOT
from llmgw.protocol import wire
from llmgw.store import Database, connect, migrate
from llmgw.store.usage import ingest
from llmgw.store.usage_post import from_batch, from_json

TARGET = 20_000.0  # requests recorded per second, each backend
# Loopback without TLS, as a control plane next to its database runs; over TLS, encrypting
# every batch adds to both sides' CPU (asyncpg's default, sslmode=prefer, would use it).
PG_ADMIN = os.environ.get(
    "LLMGW_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test?sslmode=disable"
)
T0 = 1_793_491_200.0
REQUESTS = 40_000  # per run; 8 runs (2 backends x 2 shapes x 1 or 2 in flight)
_decode = msgspec.json.Decoder(wire.UsageBatch).decode


class Run(msgspec.Struct, kw_only=True):
    """One backend, shape and concurrency."""

    backend: str
    shape: str
    in_flight: int
    batch: int
    requests: int
    wall_s: float
    cpu_s: float
    """This process plus the PostgreSQL backends that served it."""
    records_per_s: float
    records_per_cpu_s: float


class UsageResult(Result, kw_only=True):
    """A `python -m bench run usage` result: the common fields plus every run."""

    runs: list[Run] = msgspec.field(default_factory=list)
    checks: list[Check] = msgspec.field(default_factory=list)


def _batches(n: int, size: int, shape: str, gateway: str) -> list[bytes]:
    """`n` requests in posts of `size`, encoded as one gateway sends them."""
    route = msgspec.Raw(b'{"policy":"prefix","replica":"r1","matched_blocks":12,"candidates":4}')

    def final(i: int) -> wire.UsageRecord:
        return wire.UsageRecord(
            request_id=f"{gateway}-{i:09d}-{secrets.token_hex(4)}",
            model=f"model-{i % 4}",
            upstream_model=f"org/model-{i % 4}",
            replica=f"r{i % 4}",
            status="ok",
            http_status=200,
            stream=bool(i % 2),
            prompt_tokens=300 + i % 100,
            completion_tokens=50 + i % 30,
            usage_estimated=False,
            ttft_ms=12.5,
            duration_ms=240.0,
            finish_reason="stop",
            retries=0,
            started_at=T0 + i * 0.001,
            route=route,
            key_id=f"key_{i % 200:016d}",
            user_id=f"user_{i % 100:016d}",
            project_id=f"proj_{i % 50:016d}",
            team_id=f"team_{i % 10:016d}",
            org_id="org_0000000000000000",
        )

    finals = [final(i) for i in range(n)]
    opens = [
        wire.UsageOpen(
            request_id=f.request_id,
            model=f.model,
            started_at=f.started_at,
            prompt_estimate=f.prompt_tokens,
            key_id=f.key_id,
            user_id=f.user_id,
            project_id=f.project_id,
            team_id=f.team_id,
            org_id=f.org_id,
        )
        for f in finals
    ]
    chunks = [range(s, min(s + size, n)) for s in range(0, n, size)]
    out = []
    rows = [wire.UsageRow(*msgspec.structs.astuple(f)) for f in finals]
    for k in range(len(chunks) + (shape != "final")):
        if shape == "final":
            batch = wire.UsageBatch(gateway_id=gateway, rows=[rows[i] for i in chunks[k]])
        else:  # batch k: the opens of chunk k and the finals of chunk k-1
            batch = wire.UsageBatch(
                gateway_id=gateway,
                opens=[opens[i] for i in chunks[k]] if k < len(chunks) else [],
                rows=[rows[i] for i in chunks[k - 1]] if k else [],
            )
        out.append(msgspec.json.encode(batch))
    return out


def _proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _server_pids(db: Database) -> list[int]:
    if db.dialect != "postgres":
        return []
    name = await db.fetchval("SELECT current_database()")
    rows = await db.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", name)
    return [int(r[0]) for r in rows]


async def _measure(
    db: Database, backend: str, shape: str, in_flight: int, n: int, size: int
) -> Run:
    streams = [_batches(n // in_flight, size, shape, f"gw{k}-{shape}") for k in range(in_flight)]
    pids = await _server_pids(db)
    c0 = time.process_time() + sum(_proc_cpu(p) for p in pids)
    t0 = time.perf_counter()

    async def ship(posts: list[bytes]) -> None:
        for data in posts:
            # As the control plane's usage route reads a post.
            post = from_json(data) or from_batch(_decode(data))
            await ingest(db, post, time.time())

    await asyncio.gather(*(ship(s) for s in streams))
    wall = time.perf_counter() - t0
    pids = sorted(set(pids) | set(await _server_pids(db)))
    cpu = time.process_time() + sum(_proc_cpu(p) for p in pids) - c0
    done = (n // in_flight) * in_flight
    return Run(
        backend=backend,
        shape=shape,
        in_flight=in_flight,
        batch=size,
        requests=done,
        wall_s=round(wall, 3),
        cpu_s=round(cpu, 3),
        records_per_s=round(done / wall),
        records_per_cpu_s=round(done / cpu) if cpu > 0 else 0.0,
    )


async def _pg_database() -> str:
    import asyncpg

    name = "llmgw_bench_" + secrets.token_hex(4)
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, query = PG_ADMIN.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")


async def _drop_pg(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN)
    try:
        name = url.partition("?")[0].rsplit("/", 1)[1]
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _run_all(n: int, size: int, tmp: str) -> list[Run]:
    runs = []
    for backend in ("sqlite", "postgres"):
        url = f"sqlite:///{tmp}/usage.db" if backend == "sqlite" else await _pg_database()
        try:
            db = await connect(url)
            try:
                await migrate(db)
                await _measure(db, backend, "final", 1, min(n, 2 * size), size)  # warm-up
                for shape in ("final", "open+final"):
                    for in_flight in (1, 2):
                        run = await _measure(db, backend, shape, in_flight, n, size)
                        print(
                            f"  {backend:<8} {shape:<10} in flight {in_flight}: "
                            f"{run.records_per_s:>8,.0f}/s  {run.records_per_cpu_s:>8,.0f}/cpu-s",
                            file=sys.stderr,
                        )
                        runs.append(run)
            finally:
                await db.close()
        finally:
            if backend == "postgres":
                await _drop_pg(url)
    return runs


def _checks(runs: list[Run]) -> tuple[dict[str, float | None], list[Check]]:
    figs: dict[str, float | None] = {}
    for r in runs:
        figs[f"{r.backend}_{r.shape.replace('+', '_')}_c{r.in_flight}_per_s"] = r.records_per_s
        figs[f"{r.backend}_{r.shape.replace('+', '_')}_c{r.in_flight}_per_cpu_s"] = (
            r.records_per_cpu_s
        )
    checks = [
        check(f"{b}_open_final_c2_per_s", figs.get(f"{b}_open_final_c2_per_s"), ">=", TARGET)
        for b in ("sqlite", "postgres")
    ]
    return figs, checks


def run_usage(args: argparse.Namespace) -> int:
    """Runs both backends, writes bench/results/usage-DATE-HOST.json; 1 when a backend fails."""
    n, size = (10_000, 1000) if args.quick else (REQUESTS, 1000)
    machine, started, code = machine_facts(), now_iso(), git_state(str(ROOT))
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-usage-") as tmp:
        runs = asyncio.run(_run_all(n, size, tmp))
    figures, checks = _checks(runs)
    machine.loadavg_end = list(os.getloadavg())
    res = UsageResult(
        scenario="usage",
        date=today(),
        started_at=started,
        finished_at=now_iso(),
        command=command(args),
        machine=machine,
        versions={**versions("llmgw", "asyncpg", "msgspec"), "llmgw_git": code},
        settings={"requests": n, "batch": size, "quick": bool(args.quick)},
        targets=[
            Target(
                name=b,
                kind="in-process",
                version=code,
                command=[],
                notes="llmgw.store.usage.ingest, one process",
            )
            for b in ("sqlite", "postgres")
        ],
        rounds=[],
        summary=[],
        void=False,
        void_reason="",
        figures=figures,
        runs=runs,
        checks=checks,
    )
    out = Path(args.out) if args.out else result_path("usage", res.date, res.machine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(markdown(res))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def markdown(res: UsageResult) -> str:
    """The runs and the checks, as bench/README.md shows them."""
    out = [
        (
            f"**usage** ({res.date}, `{res.command}`, llmgw {res.versions.get('llmgw_git', '?')}, "
            f"{res.machine.nproc} cores, load average {res.machine.loadavg_start[0]:.1f} at "
            f"start, batches of {res.settings.get('batch')})"
        ),
        "",
        "| backend | shape | in flight | requests/s | requests/CPU-s |",
        "|---|---|---:|---:|---:|",
    ]
    for r in res.runs:
        out.append(
            f"| {r.backend} | {r.shape} | {r.in_flight} | {r.records_per_s:,.0f} | "
            f"{r.records_per_cpu_s:,.0f} |"
        )
    out += ["", "| check | measured | target | verdict |", "|---|---:|---:|---|"]
    for c in res.checks:
        verdict = "not measured" if c.met is None else ("met" if c.met else "missed")
        out.append(f"| `{c.name}` | {_f(c.value, 0)} | {c.op} {c.target:,.0f} | {verdict} |")
    return "\n".join(out)
