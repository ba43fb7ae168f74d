"""`python -m bench run auth`: what API keys and limits add to one request, in process.

Times the gateway's own request-path code, nothing else, as the gateway calls it: the key's
lookup (`KeyIndex.get_live`: the Authorization header after `Bearer `, keyed hash, lookup
among 10,000 keys, expiry), and the limiter's admission (`_core.take` on the limiter's memo:
`Limiter.take` for a key seen before) + `Ticket.release`, for a key with rpm, concurrency
and tpm limits in a project with a budget, with the worker's shares already leased (the
steady state: a lease call happens once per batch of units, off this path for every other
request).
The target is at most 20 µs added per request. Result in
`bench/results/auth-DATE-HOST.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from bench.report import Result, Target, command, git_state, machine_facts, now_iso, result_path, today
from bench.runner import ROOT
from llmgw import _core
from llmgw.control.limits import LimitsAuthority
from llmgw.gateway.auth import SCHEME, KeyTable
from llmgw.gateway.limits import Limiter
from llmgw.protocol.wire import KeyEntry, Limits, Snapshot
from llmgw.secrets.keys import HASH_LABEL, derive, key_hash

TARGET_US = 20.0
KEYS = 10_000


class AuthResult(Result, kw_only=True):
    """A `python -m bench run auth` result: the common fields plus µs per request per round."""

    us: dict[str, list[float]] = msgspec.field(default_factory=dict)
    """Path -> microseconds per request, one value per round (loop: the empty loop)."""
    verdict: str = ""


def _time(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000.0


def measure(rounds: int, n: int) -> dict[str, list[float]]:
    """Microseconds per request of: the auth path, and the auth + limits path."""
    secret = b"s" * 32
    hk = derive(secret, HASH_LABEL)
    keys = [f"sk-llmgw-{i:040d}" for i in range(KEYS)]
    entries = [
        KeyEntry(key_id=f"key_{i}", hash=key_hash(hk, k), org_id="org_1", team_id="team_1",
                 project_id="proj_1", expires_at=time.time() + 86400,
                 limits=Limits(rpm=10**9, concurrency=10**6, tpm=10**12))
        for i, k in enumerate(keys)
    ]
    project = Limits(budget_tokens=10**15, budget_period="month")
    table = KeyTable(hk)
    table.load(Snapshot(version=1, keys=entries, projects={"proj_1": project}))
    header = "Bearer " + keys[KEYS // 2]
    entry = table.resolve(header, "")

    auth = LimitsAuthority(ttl=3600.0)
    limiter = Limiter("bench", auth.lease, wait=5.0)

    async def prime() -> None:
        # Lease enough for the whole run in one go (a real worker leases in batches).
        task = asyncio.ensure_future(limiter.run())
        t = await limiter.acquire(entry, project, 100)
        t.release(100)
        task.cancel()
        for s in (limiter.keys[entry.key_id], limiter.projects["proj_1"]):
            s.units = 10**9
            s.slots_free = s.slots_held = 10**6
            if s.tok is not None:
                s.tok.balance = 10**15
                s.tok.until = float("inf")
            s.units_until = float("inf")

    asyncio.run(prime())

    def resolve() -> object:
        return table.keys.get_live(header, SCHEME)

    def resolve_and_limit() -> object:
        e = table.keys.get_live(header, SCHEME)
        t = _core.take(limiter.memo, e, table.projects.get(e.project_id), limiter.clock(), 300)
        assert t is not None and t is not False
        t.release(120)
        return t

    def nothing() -> object:
        return None

    out: dict[str, list[float]] = {"loop": [], "auth": [], "auth_limits": []}
    for _ in range(rounds):
        out["loop"].append(_time(nothing, n))
        out["auth"].append(_time(resolve, n))
        out["auth_limits"].append(_time(resolve_and_limit, n))
    return out


def run_auth(args: argparse.Namespace) -> int:
    """Runs the measurement, prints it and writes the result file."""
    rounds = 2 if args.quick else args.rounds
    n = 20_000 if args.quick else 200_000
    started = now_iso()
    machine = machine_facts()
    us = measure(rounds, n)
    med = {k: round(statistics.median(v), 3) for k, v in us.items()}
    added = round(med["auth_limits"] - med["loop"], 3)
    verdict = (f"{added:.2f} µs added per request (auth {med['auth'] - med['loop']:.2f} µs): "
               f"{'meets' if added <= TARGET_US else 'misses'} the {TARGET_US:g} µs target")
    code = git_state(str(ROOT))
    res = AuthResult(
        scenario="auth", date=today(), started_at=started, finished_at=now_iso(),
        command=command(args),
        machine=machine, versions={"llmgw_git": code, "python": sys.version.split()[0]},
        settings={"rounds": rounds, "per_round": n, "keys": KEYS, "quick": bool(args.quick)},
        targets=[Target(name="auth+limits", kind="in-process", version=code, command=[])],
        rounds=[], summary=[], void=False, void_reason="",
        figures={"auth_us": round(med["auth"] - med["loop"], 3), "added_us": added, "target_us": TARGET_US},
        us={k: [round(x, 3) for x in v] for k, v in us.items()}, verdict=verdict,
    )
    print(markdown(res))
    out = Path(args.out) if args.out else result_path("auth", res.date, res.machine)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(res)) + b"\n")
    print(f"\nwritten {out}")
    return 0 if added <= TARGET_US else 1


def markdown(res: AuthResult) -> str:
    """The result as a Markdown table."""
    lines = ["| path | µs per request (median over rounds) | min–max |", "|---|---|---|"]
    for k, v in res.us.items():
        lines.append(f"| {k} | {statistics.median(v):.3f} | {min(v):.3f}–{max(v):.3f} |")
    return "\n".join([*lines, "", res.verdict])
