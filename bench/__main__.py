"""`python -m bench load|run|soak|pool|table`: the command line of llmgw's load harness."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import uvloop

T = TypeVar("T")


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(coro)


def _load(args: argparse.Namespace) -> int:
    from bench.load import LoadSpec, run_load
    from bench.report import load_table

    spec = LoadSpec(
        url=args.url,
        model=args.model,
        concurrency=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        stream=args.stream,
        rate=args.rate,
        max_tokens=args.max_tokens,
        timeout=args.timeout,
        api_key=args.api_key,
    )
    try:
        result = _run_async(run_load(spec, progress=True, warmup=1))
    except ValueError as e:
        print(f"bench load: {e}", file=sys.stderr)
        return 2
    print(load_table(spec, result))
    if args.json:
        doc = {"argv": args.argv, "spec": spec, "result": result}
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(doc)) + b"\n")
    return 0


def _scenario(args: argparse.Namespace) -> int:
    from bench.scenarios import SCENARIOS, run_scenario

    if args.scenario not in SCENARIOS:
        print(
            f"bench run: unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    return run_scenario(args)


def _table(args: argparse.Namespace) -> int:
    if not args.files:
        from bench.table import write

        page = Path(args.out)
        changed = write(Path(args.results), page)
        if args.check and changed:
            print(f"bench table: {page} did not match {args.results}; it is rewritten now, "
                  "commit it", file=sys.stderr)
            return 1
        print(f"bench: {'wrote' if changed else 'unchanged'} {page}", file=sys.stderr)
        return 0

    from bench.report import Result, markdown
    from bench.scenarios import SCENARIOS, load

    for path in args.files:
        raw = Path(path).read_bytes()
        scenario = msgspec.json.decode(raw, type=_Scenario).scenario
        known = SCENARIOS.get(scenario)
        own = known.own if known is not None else None
        if own is not None:
            text = load(own.table)(msgspec.json.decode(raw, type=load(own.result)))
        else:
            text = markdown(msgspec.json.decode(raw, type=Result))
        print(text + "\n")
    return 0


class _Scenario(msgspec.Struct):
    """Just the scenario of a result file, to pick its table."""

    scenario: str


def main(argv: list[str] | None = None) -> int:
    """Parses the command line and runs the command."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    ld = sub.add_parser("load", help="drive load at any OpenAI-compatible endpoint")
    ld.add_argument(
        "--url", required=True, help="base URL (http://host:port[/v1]) or the full chat path"
    )
    ld.add_argument("--model", default="sim-model")
    ld.add_argument(
        "--concurrency", "-c", type=int, default=1, help="connections, one request at a time each"
    )
    ld.add_argument("--requests", "-n", type=int, default=0, help="stop after this many requests")
    ld.add_argument(
        "--duration", "-d", type=float, default=0.0, help="stop after this many seconds"
    )
    ld.add_argument("--stream", action="store_true", help="stream the answers (SSE)")
    ld.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests/s over all connections (default: flat out)",
    )
    ld.add_argument("--max-tokens", type=int, default=16)
    ld.add_argument("--timeout", type=float, default=30.0, help="per-request limit in seconds")
    ld.add_argument("--api-key", default="bench", help="bearer token to send (default: bench)")
    ld.add_argument("--json", metavar="OUT", help="write the result here")
    ld.set_defaults(fn=_load)

    from bench.scenarios import SCENARIOS, add_run_options

    rn = sub.add_parser("run", help="a standard scenario: starts upstream, gateway and peers")
    rn.add_argument("scenario", help=" | ".join(SCENARIOS))
    add_run_options(rn)
    rn.set_defaults(fn=_scenario)

    sk = sub.add_parser("soak", help="the gateway's RSS over many requests (= run soak)")
    add_run_options(sk)
    sk.set_defaults(fn=_scenario, scenario="soak")

    from bench.pool import add_parser as add_pool

    add_pool(sub)

    from bench.table import PAGE, RESULTS

    tb = sub.add_parser("table", help="write bench/RESULTS.md from bench/results/, or print the "
                        "tables of the result files named")
    tb.add_argument("files", nargs="*", help="result files to print as Markdown (default: none, "
                    "write the page instead)")
    tb.add_argument("--results", default=str(RESULTS), help="folder of result files to read")
    tb.add_argument("--out", default=str(PAGE), help="the page to write (default bench/RESULTS.md)")
    tb.add_argument("--check", action="store_true",
                    help="exit 1 when the page was out of date (it is rewritten all the same)")
    tb.set_defaults(fn=_table)

    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `report.command` records
    if args.cmd == "load" and not args.requests and not args.duration:
        args.requests = 1000  # a load run always stops by itself
    rc: int = args.fn(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
