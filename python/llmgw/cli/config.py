"""`llmgw config check FILE` and `llmgw config defaults`: server.yaml checked, and written out.

`check` reads the file through the same loader as `llmgw up`, `llmgw server` and `llmgw
gateway`, and asks the router about `gateway.routing` as the gateway does, so it refuses what
they would refuse at start, every fault at once; what only the machine that runs them knows (a
port taken, the data dir's secret) is theirs to say.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `config check` or `config defaults` (the one being parsed)."""
    if parser.prog.split()[-1] == "check":
        parser.add_argument("file", metavar="FILE", help="the server.yaml to check")


def run(args: argparse.Namespace) -> int:
    """`check`: 0 and one line for a good file, 1 and every fault for a bad one; `defaults`:
    the whole schema with its defaults, as YAML."""
    from llmgw.config import ConfigError
    from llmgw.config.file import defaults_yaml, load_server_file

    if args.config == "defaults":
        sys.stdout.write(defaults_yaml())
        return 0
    try:
        loaded = load_server_file(args.file)
        from llmgw.gateway.routing import validate

        gateway = loaded.gateway
        validate(gateway.routing, [(ep.id, ep.models) for ep in gateway.endpoints])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.file}: OK ({_count(len(loaded.gateway.endpoints), 'endpoint')}, "
          f"{_count(len(loaded.models), 'model')})")
    return 0


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"
