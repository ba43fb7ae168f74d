"""`llmgw server`: the control plane, serving the admin API with granian (exactly one worker)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec

from llmgw.config import ConfigError
from llmgw.net.serving import bind_port, serve_app
from llmgw.secrets.datadir import DataDirError

if TYPE_CHECKING:
    from llmgw.control.settings import Settings


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the control plane's options."""
    from llmgw.control.settings import default_data_dir

    parser.add_argument("--data-dir", metavar="DIR", type=Path, default=None,
                        help=f"where the secret, the admin token and the SQLite store live "
                             f"(default {default_data_dir()})")
    parser.add_argument("--store", metavar="URL",
                        help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
                             "(default sqlite:///DATA_DIR/llmgw.db)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of the admin listener (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8081,
                        help="port of the admin listener (default 8081; 0: a free one)")
    parser.add_argument("--config", metavar="PATH",
                        help="server.yaml to read (its `control_plane:` and `models:` sections; "
                             "the whole file is checked, as by `llmgw config check`)")


def _prepare(args: argparse.Namespace) -> tuple[str, IO[str] | None, str]:
    """Validates everything, creates the data dir's files, takes the SQLite store's lock,
    migrates, and puts the process under `cpu_scheduling` (before granian forks the worker,
    which inherits it); returns the worker's config, the lock's file (held while it is
    open) and the ready line."""
    from llmgw.config.file import load_or_defaults
    from llmgw.control.catalog import Catalog
    from llmgw.control.settings import ServerConfig, default_data_dir, encode_config
    from llmgw.secrets import datadir
    from llmgw.store import connect, migrate

    data_dir = (args.data_dir or default_data_dir()).expanduser().absolute()
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port {args.port} is not a TCP port (1-65535, or 0 for a free one)")
    # The whole file is checked, as by `llmgw config check`; this process runs two sections.
    loaded = load_or_defaults(args.config)
    settings = loaded.control_plane
    models = list(Catalog(loaded.models))
    datadir.prepare(data_dir)
    store = args.store or f"sqlite:///{data_dir / 'llmgw.db'}"
    lock = _lock_sqlite(store, data_dir)  # first: a second server says only why it cannot run
    settings, held = _agent_ports(settings)
    agents = f"; agents connect on {settings.agent_host}:{settings.agent_port}"
    if not settings.agent_insecure:
        agents += f", join on {settings.agent_host}:{settings.join_port}"
        from llmgw.control.pki import Authority, PkiError

        try:
            Authority(data_dir)
        except PkiError as e:
            # A warning, not a refusal: the admin API and the gateways' control work
            # without agents, and the agent port opens at the next start after init.
            print(f"warning: the agent port stays closed: {e}", file=sys.stderr)
            agents = ""

    async def migrate_once() -> None:
        # Here, in the parent, so that a store that cannot be reached or migrated
        # is one clear sentence and exit status 2, not a worker dying in granian.
        db = await connect(store)
        try:
            await migrate(db)
        finally:
            await db.close()

    asyncio.run(migrate_once())
    _schedule(settings.cpu_scheduling)
    args.port = bind_port(args.host, args.port)  # --port 0: the one it got, in config and ready line
    cfg = ServerConfig(data_dir=str(data_dir), store=store, host=args.host, port=args.port,
                       settings=settings, models=models, agent_ports_held=held)
    return (encode_config(cfg), lock,
            f"llmgw control plane listening on http://{args.host}:{args.port}{agents}")


def _agent_ports(settings: Settings) -> tuple[Settings, bool]:
    """`settings` with the agent service's ports in use, and whether this process picked them.

    A port given is checked free (`_check_free`). For agent_port 0 the kernel picks the
    agent port, and the join port too unless agent_join_port names one: `bind_port` holds
    each for this process's life (SO_REUSEPORT, never listening), the worker's gRPC server
    binds beside it (`ServerConfig.agent_ports_held`), and the ready line names both, as
    granian's listeners join the admin port of `--port 0`. Tests start servers so.
    """
    host, mtls = settings.agent_host, not settings.agent_insecure
    if settings.agent_port:
        _check_free(host, settings.agent_port, "agent_port")
        if mtls:
            _check_free(host, settings.join_port, "agent_join_port")
        return settings, False
    join = settings.agent_join_port
    if mtls and join:
        _check_free(host, join, "agent_join_port")
    elif mtls:
        join = bind_port(host, 0)
    picked = msgspec.structs.replace(settings, agent_port=bind_port(host, 0), agent_join_port=join)
    return picked, True


def _schedule(policy: str) -> None:
    """Puts this thread, and so granian's worker and every thread started after, under
    `policy` (`Settings.cpu_scheduling`); where it is refused, says so and goes on."""
    if policy != "batch" or not hasattr(os, "SCHED_BATCH"):
        return
    try:
        # Lowering one's own policy needs no privilege; a sandbox may still refuse it.
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as e:
        print(f"warning: the control plane runs under the normal CPU policy, as SCHED_BATCH was "
              f"refused ({e.strerror}); gateways on this machine may wait for it while it "
              "ingests usage. Set `cpu_scheduling: normal` under control_plane: to silence this",
              file=sys.stderr)


def _lock_sqlite(store: str, data_dir: Path) -> IO[str] | None:
    """On SQLite, an exclusive lock on `<store file>.lock` for the life of this process.

    Several control planes lead by a lease in PostgreSQL; on SQLite there is no lease and
    exactly one control plane may run, so a second one on the same file must not start
    (it would place every replica a second time). flock, not a pid file: the kernel
    drops it when the process dies, even by SIGKILL, so a crash never blocks a restart.
    """
    from llmgw.store.sqlite import file_of

    path = file_of(store) if store.startswith("sqlite:") else ""
    if path in ("", ":memory:"):
        return None
    lock_path = Path(path + ".lock")
    try:
        f = lock_path.open("a+")
    except OSError as e:
        raise DataDirError(f"cannot create the lock file {lock_path}: {e.strerror}") from e
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise DataDirError(
            f"another llmgw server (pid {holder}) already runs on the SQLite store {path} "
            f"(data dir {data_dir}); on SQLite there is exactly one control plane. Stop it "
            "first, or give this one another --data-dir; for several control planes, use "
            "one PostgreSQL store (--store postgresql://...)") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _check_free(host: str, port: int, setting: str) -> None:
    """Raises ConfigError when the agent service could not listen on (host, port): said
    here as one sentence, not as the worker's traceback after the admin port opened."""
    from llmgw.control.settings import port_taken

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds it
            s.bind(address)
    except OSError as e:
        raise ConfigError(port_taken(f"{host}:{port}", e.strerror or e, setting)) from None


def run(args: argparse.Namespace) -> int:
    """Prepares the data dir and store, then serves until SIGTERM/SIGINT."""

    from granian.http import HTTP1Settings

    from llmgw.control.settings import CONFIG_ENV, decode_config
    from llmgw.store import StoreError

    # Everything this process creates (the SQLite store, its WAL) holds key hashes
    # and audit rows: owner-only, like the secret beside it.
    os.umask(0o077)
    try:
        encoded, lock, ready = _prepare(args)
    except (ConfigError, DataDirError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.environ[CONFIG_ENV] = encoded
    # Exactly one worker: the control plane's state (snapshots, leases) lives in it.
    serve_app("llmgw.control.server:create_app", args.host, args.port, ready,
              http1_settings=HTTP1Settings(
                  header_read_timeout=int(decode_config(encoded).settings.admin_header_timeout * 1000)))
    if lock is not None:
        lock.close()
    return 0
