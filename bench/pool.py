"""`python -m bench pool FILE...`: llmgw-keys over llmgw, pooled over several throughput runs.

The keyed target's figure is the ratio of the two gateways' req/s at each concurrency. One run of
15 two-second rounds gives it to a few hundredths only: on this 2-core host, where the
scheduler puts the control plane against the gateway moves a whole run, and one level of
one run in three lands under a ratio the runs together put well over it. This pools the
rounds of several runs of the same code and says where the ratio lies: the ratio of the
pooled medians, the median of the rounds' own ratios, and a 95% interval from a two-stage
bootstrap (runs, then rounds within them; `bench.stats.bootstrap_ratio`), beside each
run's own ratio so that no run is hidden in the pool.

Runs pool only when they measured the same code: the same commit, or commits whose
`python/` and `rust/` git says are the same, and none with changes outside a commit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import msgspec

from bench.keyed import NAME as KEYED
from bench.report import Result, command, now_iso, today
from bench.runner import ROOT, rps_pairs
from bench.stats import bootstrap_ratio, median, ratio_of_medians, ratio_spread

PLAIN = "llmgw"
TARGET = 0.9
"""The target: keys and usage on stay within 10% of the gateway without them."""


class Level(msgspec.Struct, kw_only=True):
    """One concurrency level over every pooled run."""

    concurrency: int
    rounds: int
    plain_rps: float
    """Median req/s of llmgw over every pooled round."""
    keyed_rps: float
    ratio_of_medians: float
    ci95: tuple[float, float]
    """Where the ratio of medians lies: the two-stage bootstrap's 95% interval."""
    paired_median: float
    """The median of each round's own ratio (the two ran one after the other)."""
    per_run: list[float]
    """Each run's own ratio of medians, in the order of `Pooled.files`."""
    runs_meeting: int
    """Runs whose own ratio is at least `Pooled.target`."""


class Pooled(msgspec.Struct, kw_only=True):
    """A pool's result, as `--out` writes it."""

    kind: str = "pooled-throughput-keys"
    date: str
    made_at: str
    command: str
    files: list[str]
    code: list[str]
    """The commits the runs measured (`versions.llmgw_git`)."""
    code_note: str
    target: float
    levels: list[Level]
    machines: list[str] = []
    """Each run's CPU model, in the order of `files`: a pool is read for one kind of host."""


class PoolError(Exception):
    """The files cannot be pooled; the message says why and what to do."""


def _same_code(a: str, b: str) -> bool:
    """Whether commits a and b hold the same python/ and rust/ (git answers; False if it cannot)."""
    r = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", a, b, "--", "python", "rust"],
                       check=False, capture_output=True)
    return r.returncode == 0


def check_code(commits: list[str]) -> str:
    """Says in words why these runs measured one code, or raises PoolError."""
    dirty = sorted({c for c in commits if c.endswith("+dirty") or c in ("", "unknown")})
    if dirty:
        raise PoolError(f"runs of uncommitted or unknown code ({', '.join(dirty) or 'none recorded'}) "
                        "cannot be shown to match the others; pool runs made from a clean checkout, "
                        "or pass --any-code")
    distinct = list(dict.fromkeys(commits))
    if len(distinct) == 1:
        return f"one commit, {distinct[0]}"
    differ = [c for c in distinct[1:] if not _same_code(distinct[0], c)]
    if differ:
        raise PoolError(f"python/ or rust/ differ between {distinct[0]} and {', '.join(differ)} "
                        "(or git does not know one of them): these runs measured different code; "
                        "pool the runs of one code, or pass --any-code to pool them anyway")
    return f"commits {', '.join(distinct)}, whose python/ and rust/ git says are the same"


def pool(results: list[Result], levels: list[int] | None = None) -> list[Level]:
    """The pooled figures at each concurrency both gateways ran at in every result."""
    for n, res in enumerate(results, 1):
        if res.scenario != "throughput":
            raise PoolError(f"result {n} is of scenario {res.scenario!r}; only throughput results pool")
    common = None
    for res in results:
        have = {r.concurrency for r in res.rounds if r.target == KEYED} & \
            {r.concurrency for r in res.rounds if r.target == PLAIN}
        common = have if common is None else common & have
    if not common:
        raise PoolError(f"no concurrency has rounds of both {PLAIN} and {KEYED} in every result; "
                        f"pool runs of `python -m bench run throughput --peers {KEYED}`")
    out = []
    for c in levels or sorted(common):
        if c not in common:
            raise PoolError(f"concurrency {c} is not in every result; they share {sorted(common)}")
        groups = [rps_pairs(res.rounds, KEYED, PLAIN, c) for res in results]
        every = [p for g in groups for p in g]
        per_run = [ratio_of_medians(g) for g in groups]
        out.append(Level(
            concurrency=c,
            rounds=len(every),
            plain_rps=median([b for _, b in every]),
            keyed_rps=median([a for a, _ in every]),
            ratio_of_medians=ratio_of_medians(every),
            ci95=bootstrap_ratio(groups),
            paired_median=ratio_spread(every)["median"],
            per_run=per_run,
            runs_meeting=sum(r >= TARGET for r in per_run),
        ))
    return out


def table(p: Pooled) -> str:
    """The pool as a Markdown table, one row per concurrency."""
    lines = [
        (f"{KEYED} over {PLAIN}, req/s, pooled over {len(p.files)} runs ({p.code_note}); "
         f"target {p.target:g}"),
        "",
        ("| concurrency | rounds | llmgw req/s | llmgw-keys req/s | ratio of medians | 95% interval "
         "| paired median | runs at or over the target | each run |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in p.levels:
        lines.append(
            f"| {lv.concurrency} | {lv.rounds} | {lv.plain_rps:,.0f} | {lv.keyed_rps:,.0f} "
            f"| {lv.ratio_of_medians:.3f} | {lv.ci95[0]:.3f} - {lv.ci95[1]:.3f} | {lv.paired_median:.3f} "
            f"| {lv.runs_meeting} of {len(lv.per_run)} | {' / '.join(f'{r:.3f}' for r in lv.per_run)} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`python -m bench pool`: reads, checks, pools, prints and (with --out) writes."""
    try:
        results = []
        for f in args.files:
            try:
                results.append(msgspec.json.decode(Path(f).read_bytes(), type=Result))
            except (OSError, msgspec.DecodeError) as e:
                raise PoolError(f"{f}: cannot read it as a bench result ({e})") from None
        commits = [r.versions.get("llmgw_git", "") for r in results]
        note = "code not checked (--any-code)" if args.any_code else check_code(commits)
        levels = [int(x) for x in args.concurrency.split(",")] if args.concurrency else None
        out = Pooled(date=today(), made_at=now_iso(), command=command(args),
                     files=list(args.files), code=commits, code_note=note, target=TARGET,
                     levels=pool(results, levels),
                     machines=[r.machine.cpu_model for r in results])
    except PoolError as e:
        print(f"bench pool: {e}", file=sys.stderr)
        return 2
    print(table(out))
    if args.out:
        Path(args.out).write_bytes(msgspec.json.format(msgspec.json.encode(out)) + b"\n")
        print(f"bench pool: wrote {args.out}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds `pool` to `python -m bench`."""
    p = sub.add_parser("pool", help="llmgw-keys over llmgw pooled over several throughput runs, "
                                    "with a bootstrap interval")
    p.add_argument("files", nargs="+", help="throughput results with llmgw and llmgw-keys rounds")
    p.add_argument("--concurrency", help="comma-separated levels (default: every level all share)")
    p.add_argument("--any-code", action="store_true",
                   help="pool runs even when they measured different code")
    p.add_argument("--out", help="write the pool as JSON here")
    p.set_defaults(fn=main)
