"""`llmgw gateway`: the OpenAI gateway, served by granian over RSGI; open (router-only) alone, with
keys, limits and usage when given control planes."""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import shutil
import sys
import tempfile
from typing import Any

import msgspec

from llmgw.config import CONFIG_ENV, ConfigError, GatewayConfig, encode_gateway, parse_endpoint
from llmgw.net.serving import bind_port, serve_app


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the gateway's options."""
    parser.add_argument("--config", metavar="PATH",
                        help="server.yaml to read (its `gateway:` section; the whole file is "
                             "checked, as by `llmgw config check`)")
    parser.add_argument("--endpoint", metavar="ID=URL=MODEL[,MODEL]", action="append", default=[],
                        help="a replica to route to (repeatable); added to those of --config")
    parser.add_argument("--alias", metavar="NAME=MODEL", action="append", default=[],
                        help="serve MODEL under the name NAME too (repeatable)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080; 0: a free one)")
    parser.add_argument("--workers", type=int, help="granian worker processes (default 1)")
    parser.add_argument("--usage-log", metavar="PATH", help="append a JSON line per finished request to PATH")
    parser.add_argument("--control-plane", metavar="URL[,URL]",
                        help="require API keys and apply limits from this `llmgw server` (e.g. http://127.0.0.1:8081); "
                             "several control planes on one PostgreSQL separated by commas, used one at a time")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="the control plane's data directory (its secret gives the gateway token)")


def build_config(args: argparse.Namespace) -> GatewayConfig:
    """The configuration from --config and the flags that override it."""
    from llmgw.config.file import check_server, read_server_yaml

    # Flags are merged into the file's raw values and the whole file checked once, so that
    # an alias in the file may point at a model only a flag's endpoint serves.
    doc = read_server_yaml(args.config) if args.config else {}
    raw = doc.get("gateway") or {}
    if isinstance(raw, dict):  # else the check below says what it is
        doc["gateway"] = _with_flags(raw, args)
    where = f"configuration file {args.config}" if args.config else "gateway configuration"
    cfg = check_server(doc, where).gateway
    # The router's own checks, here rather than in each worker after the fork.
    from llmgw.gateway.routing import validate

    validate(cfg.routing, [(e.id, e.models) for e in cfg.endpoints])
    if cfg.control_plane is not None:
        # Read here so a missing secret fails the command, not each worker after the fork;
        # the workers read it again (secrets do not travel in the environment).
        from llmgw.gateway.credentials import load_credentials

        load_credentials(cfg.control_plane)
    return cfg


def _with_flags(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The file's raw `gateway:` section with the flags given merged in."""
    flagged = [msgspec.to_builtins(parse_endpoint(s)) for s in args.endpoint]
    endpoints = raw.get("endpoints")
    raw["endpoints"] = ([*endpoints, *flagged] if isinstance(endpoints, list)
                        else endpoints or flagged)  # not a list: the check says so
    aliases = raw.setdefault("aliases", {})
    for spec in args.alias:
        name, sep, target = spec.partition("=")
        if not sep or not name or not target:
            raise ConfigError(f"--alias {spec!r} is not NAME=MODEL; "
                              "example: --alias gpt-4o=llama-3-70b")
        if isinstance(aliases, dict):
            aliases[name] = target
    for key in ("host", "port", "workers", "usage_log"):
        value = getattr(args, key)
        if value is not None:
            raw[key] = value
    cp = raw.get("control_plane")
    if args.control_plane is not None:
        given = cp if isinstance(cp, dict) else {}
        cp = raw["control_plane"] = {**given, "url": args.control_plane}
    if args.data_dir is not None:
        if not cp:
            raise ConfigError("--data-dir is only used with --control-plane URL "
                              "(or control_plane.url in --config)")
        if isinstance(cp, dict):
            cp["data_dir"] = args.data_dir
    return raw


DESCRIPTORS_OF_ITS_OWN = 1024
"""Descriptors a gateway needs besides its clients': its connections to the replicas, the
control plane and KV events, the metrics files, its own."""


def raise_descriptor_limit(needed: int) -> str | None:
    """Raises this process's soft descriptor limit (its workers inherit it) as far as the hard
    limit allows, towards `needed`; what to do when it stays below, or None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        return (f"this process may open {soft} descriptors, fewer than gateway.max_connections "
                f"plus {DESCRIPTORS_OF_ITS_OWN} of its own ({needed}): connections past that cannot be "
                "accepted. "
                "Raise the limit (`ulimit -n`, systemd's LimitNOFILE=, a container's nofile ulimit) "
                "or lower gateway.max_connections")
    return None


def serve(cfg: GatewayConfig) -> None:
    """Runs granian with the gateway app until it is told to stop."""
    from granian.http import HTTP1Settings

    # --port 0: the port it got, in the workers' config and in the ready line.
    cfg = msgspec.structs.replace(cfg, port=bind_port(cfg.host, cfg.port))
    os.environ[CONFIG_ENV] = encode_gateway(cfg).decode()
    short = raise_descriptor_limit(cfg.max_connections + DESCRIPTORS_OF_ITS_OWN)
    if short:
        print(f"warning: {short}", file=sys.stderr)
    if cfg.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Set before the workers fork and before prometheus_client is imported
        # anywhere (it picks its value store at import), so every worker writes
        # its samples where a scrape reads them. Hence nothing here imports the
        # gateway app in this parent process.
        metrics_dir = tempfile.mkdtemp(prefix="llmgw-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        atexit.register(shutil.rmtree, metrics_dir, True)
    serve_app("llmgw.gateway.app:create_app", cfg.host, cfg.port,
              f"llmgw gateway listening on http://{cfg.host}:{cfg.port} "
              f"({len(cfg.endpoints)} replicas, {cfg.workers} worker{'s' if cfg.workers > 1 else ''})",
              workers=cfg.workers, backlog=2048, backpressure=-(-cfg.max_connections // cfg.workers),
              http1_settings=HTTP1Settings(header_read_timeout=int(cfg.timeouts.client_headers * 1000)))


def run(args: argparse.Namespace) -> int:
    """Validates the configuration and serves."""
    try:
        cfg = build_config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not cfg.endpoints and cfg.control_plane is None:
        print("error: no replica to route to; give --endpoint ID=URL=MODEL, a --config "
              "with gateway.endpoints, or --control-plane URL of a control plane that places replicas"
              "\nhint: `llmgw up` runs a gateway in front of a local simulator",
              file=sys.stderr)
        return 2
    serve(cfg)
    return 0

