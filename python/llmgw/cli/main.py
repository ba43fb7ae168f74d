"""Entry point of the `llmgw` command.

The command tree is the table below; each leaf names a module with
`configure(parser)` and `run(args) -> int`, imported only when that command runs
so that `llmgw --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (command path, one-line help, module). A path with a parent needs the parent's
# row first; a row whose module is None is a group of subcommands, and a row with a
# module may have subcommands too (`server init`), which are then optional.
COMMANDS: list[tuple[tuple[str, ...], str, str | None]] = [
    (("up",), "run a whole llmgw on this machine: control plane, agent, a model and the gateway "
     "at :8080", "llmgw.cli.up"),
    (("gateway",), "serve the OpenAI API in front of engine replicas (keys and limits with "
     "--control-plane)", "llmgw.cli.gateway"),
    (("agent",), "run the node agent: report GPUs, run engines for the control plane",
     "llmgw.cli.agent"),
    (("server",), "run the control plane: admin API, tenancy, keys, usage, the fleet (at "
     "127.0.0.1:8081); init: its certificates", "llmgw.cli.server"),
    (("server", "init"), "create the cluster CA and the agent port's certificate in the data dir",
     "llmgw.cli.server_init"),
    (("ctl",), "manage a control plane from the command line: tenancy, keys, usage, nodes, models, "
     "replicas", "llmgw.cli.ctl"),
    (("engine",), "inference engines llmgw can run itself (the simulator, llama.cpp on the CPU)",
     None),
    (("engine", "sim"), "run the engine simulator: vLLM's OpenAI surface with no GPU",
     "llmgw.engines.sim.cli"),
    (("engine", "llamacpp"), "serve a GGUF model on the CPU with llama.cpp "
     "(pip install 'llmgw[cpu]')", "llmgw.engines.llamacpp.cli"),
    (("config",), "check a server.yaml, or print one with every default", None),
    (("config", "check"), "check a server.yaml: every fault with its path, exit status 1 when any",
     "llmgw.cli.config"),
    (("config", "defaults"), "print server.yaml with every section and setting at its default",
     "llmgw.cli.config"),
    (("alerts",), "print Prometheus alerting rules for llmgw's metrics (no leader, lost usage, "
     "failing replicas)", "llmgw.cli.alerts"),
    (("version",), "print the version of llmgw and of its Rust core", "llmgw.cli.version"),
]


class _Parser(argparse.ArgumentParser):
    """A parser that names itself in the result when it is the innermost command parsed, so an
    unknown option is refused with that command's usage (`llmgw ctl usage export: error: ...`),
    not the top-level one."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # Subcommands finish first and their namespace is copied up: the first to set it wins.
        if getattr(parsed, "_parser", None) is None:
            parsed._parser = self
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree built from COMMANDS."""
    top: argparse.ArgumentParser = _Parser(
        prog="llmgw",
        description="llmgw: an OpenAI-compatible LLM gateway and GPU-cluster control plane.")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {
        (): top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    }
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    argv = sys.argv[1:]
    for path, text, module in COMMANDS:
        parent = groups.get(path[:-1])
        if parent is None:  # a command that runs on its own and has subcommands
            parent = groups[path[:-1]] = parsers[path[:-1]].add_subparsers(
                dest="_".join(path[:-1]), metavar="COMMAND", required=False)
        p = parsers[path] = parent.add_parser(path[-1], help=text,
                                              description=text[0].upper() + text[1:] + ".")
        if module is None:
            groups[path] = p.add_subparsers(dest="_".join(path), metavar="COMMAND", required=True)
            continue
        # Only the chosen command's module is imported (it adds its options).
        if list(path) == argv[: len(path)]:
            importlib.import_module(module).configure(p)
        p.set_defaults(_module=module)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    if argv is not None:
        sys.argv[1:] = list(argv)
    args, extras = build_parser().parse_known_args()
    if extras:
        args._parser.error(f"unrecognized arguments: {' '.join(extras)}")
    mod = importlib.import_module(args._module)
    code: int = mod.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
