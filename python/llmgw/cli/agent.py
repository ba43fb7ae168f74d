"""`llmgw agent`: run the node agent (GPU inventory, engine supervisor, stream to the control plane)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from llmgw.agent.client import Agent, AgentConfig, AgentConfigError
from llmgw.agent.inventory import FakeGpuSpecError, detect, host_facts
from llmgw.agent.join import JoinError, credentials, default_state_dir, join, needs_join
from llmgw.agent.supervisor import Supervisor, SupervisorSettings

READY_PREFIX = "llmgw-agent registered"
_D = SupervisorSettings()
_A = AgentConfig(control_planes=(), node_id="")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the agent's options to `parser`."""
    add = parser.add_argument
    add("--control-plane", required=True, metavar="HOST:PORT[,HOST:PORT]",
        help="control planes' agent ports; after a cut the agent tries each in turn")  # fmt: skip
    add("--node-id", default=None, help="this node's stable id (default: /etc/machine-id, else the hostname)")
    add("--label", action="append", default=[], metavar="KEY=VALUE", help="a node label; repeat for several")
    add("--fake-gpus", default=None, metavar="COUNTxMODEL-MEMGB[,...]",
        help="declare simulated GPUs instead of asking NVML, e.g. 4xH100-80GB")  # fmt: skip
    add("--port-range", default=f"{_D.port_range[0]}-{_D.port_range[1]}", metavar="LOW-HIGH",
        help=f"ports for engines (default {_D.port_range[0]}-{_D.port_range[1]})")  # fmt: skip
    add("--engine-host", default=_D.engine_host,
        help=f"address engines bind (default {_D.engine_host}; gateways must reach it)")  # fmt: skip
    add("--advertise-address", default="", help="host gateways use for this node's engines")
    add("--insecure", action="store_true",
        help="plaintext to a control plane on loopback (never over a network)")  # fmt: skip
    add("--join-token", default=os.environ.get("LLMGW_JOIN_TOKEN") or None, metavar="TOKEN",
        help="join the cluster with a token from `llmgw ctl nodes join-token` (or $LLMGW_JOIN_TOKEN, "
             "kept out of `ps`): the node gets its certificate, kept in --state-dir (joins again "
             "only for a new token)")  # fmt: skip
    add("--join-port", type=int, default=None, metavar="PORT",
        help="the control plane's join port (default: the --control-plane port + 1)")
    add("--state-dir", type=Path, default=None, metavar="DIR",
        help=f"where a joined node keeps its key and certificates (default {default_state_dir()})")  # fmt: skip
    add("--cert", default=None, help="the node's certificate (PEM) for mutual TLS")
    add("--key", default=None, help="the node's private key (PEM)")
    add("--ca", default=None, help="the cluster CA certificate (PEM)")
    add("--heartbeat-interval", type=float, default=_A.heartbeat_interval_s,
        help="seconds between heartbeats until the control plane sets it "
             f"(default {_A.heartbeat_interval_s:g})")  # fmt: skip


def _node_id(given: str | None) -> str:
    if given:
        return given
    try:
        return Path("/etc/machine-id").read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def _port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = 0
    if not sep or not 0 < lo <= hi < 65536:
        raise AgentConfigError(f"--port-range {text!r} is not LOW-HIGH with 1 <= LOW <= HIGH <= 65535, "
                               "e.g. 20000-20999")
    return lo, hi


def _labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AgentConfigError(f"--label {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def _joined(args: argparse.Namespace, targets: tuple[str, ...],
            node_id: str) -> tuple[str | None, str | None, str | None]:
    """The node's certificate, key and CA from its state dir, joining first when a new
    --join-token is given; (None, None, None) when it has not joined (check_config says so)."""
    state = (args.state_dir or default_state_dir()).expanduser()
    if args.join_token:
        try:
            fresh = needs_join(state, args.join_token)
        except ValueError as e:
            raise AgentConfigError(str(e)) from None
        if fresh:
            if not targets:
                raise AgentConfigError("no control plane given; pass --control-plane HOST:PORT")
            # The first control plane that answers; a refusal is final (the token is bad).
            for i, target in enumerate(targets):
                try:
                    join(target, args.join_port, args.join_token, node_id, state)
                    break
                except JoinError as e:
                    if e.refused or i == len(targets) - 1:
                        raise AgentConfigError(f"cannot join: {e}") from None
            print(f"llmgw agent: joined the cluster as node {node_id}; certificate in {state}",
                  flush=True)  # fmt: skip
    found = credentials(state)
    if found is None:
        if args.join_token is None:
            raise AgentConfigError(
                f"this node has not joined a cluster ({state} holds no certificate); pass "
                "--join-token from `llmgw ctl nodes join-token`, or --cert, --key and --ca, or "
                "--insecure for a control plane on this machine")
        return None, None, None
    return found


def build(args: argparse.Namespace) -> Agent:
    """The agent the options describe; raises AgentConfigError or FakeGpuSpecError with a sentence."""
    node_id = _node_id(args.node_id)
    settings = SupervisorSettings(port_range=_port_range(args.port_range), engine_host=args.engine_host)
    targets = tuple(t.strip() for t in args.control_plane.split(",") if t.strip())
    cert, key, ca = args.cert, args.key, args.ca
    if not args.insecure and not (cert or key or ca):
        cert, key, ca = _joined(args, targets, node_id)
    config = AgentConfig(
        control_planes=targets,
        node_id=node_id, labels=_labels(args.label), insecure=args.insecure, cert_file=cert,
        key_file=key, ca_file=ca, advertise_address=args.advertise_address,
        heartbeat_interval_s=args.heartbeat_interval,
    )  # fmt: skip
    inventory = detect(args.fake_gpus, node_id)
    return Agent(config, inventory, host_facts(), Supervisor(settings))


async def _serve(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = asyncio.create_task(agent.run())

    async def announce() -> None:
        while True:  # one line per registration: tests and `llmgw up` wait for it
            await agent.connected.wait()
            print(f"{READY_PREFIX} as node {agent.config.node_id} "
                  f"(registration {agent.registrations})", flush=True)  # fmt: skip
            while agent.connected.is_set():
                await asyncio.sleep(0.05)

    announcer = asyncio.create_task(announce())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait((runner, stopper), return_when=asyncio.FIRST_COMPLETED)
    announcer.cancel()
    await agent.shutdown()
    runner.cancel()
    await asyncio.gather(runner, announcer, return_exceptions=True)


def run(args: argparse.Namespace) -> int:
    """Run the agent until SIGINT or SIGTERM, then drain its engines; returns an exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent = build(args)
    except (AgentConfigError, FakeGpuSpecError) as exc:
        print(f"llmgw agent: {exc}", file=sys.stderr)
        return 2
    inv = agent.inventory
    kind = "SIMULATED" if inv.simulated else "NVML"
    print(f"llmgw agent: node {agent.config.node_id}: {len(inv.gpus)} GPUs ({kind})"
          + (f"; {inv.note}" if inv.note else ""), flush=True)  # fmt: skip
    asyncio.run(_serve(agent))
    return 0
