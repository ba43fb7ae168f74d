"""`ControlPlane`: the state one control plane process serves the admin API from.

Granian runs exactly one worker for it (`llmgw server`): snapshots, limit
leases and usage ingestion keep state in this process, so a second worker would
be a second, disagreeing authority. The worker calls `create_app()`; its
`__rsgi_init__` runs `ControlPlane.start()` on the worker's loop.

Other parts of the control plane (snapshot publisher, limits authority, usage
settling, the fleet) attach when this process becomes the leader: each is named
in `ATTACH` as `module:function`, an `async def attach(cp: ControlPlane) -> None`
that sets its slot (`cp.snapshots`, `cp.limits`, `cp.usage`), starts its tasks
with `cp.spawn` and registers its cleanup with `cp.on_stop`.

Leadership (`llmgw.control.leader`): on SQLite this process is the leader from
the start. On PostgreSQL several control planes may share the store and a lease
elects one; the others are standbys that attach no part at all (a standby that
settled usage or ran a limits authority would be a second, disagreeing
authority), refuse agents naming the leader's agent address, and forward the
admin API to the leader (`llmgw.admin.app`). A leader that loses its lease
detaches every part (`on_stop` hooks run, tasks are cancelled, slots emptied)
and is a standby again; winning it again attaches fresh parts, loaded from the
store. The agent port and the lease loop live for the whole process.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw.secrets import datadir
from llmgw.secrets.keys import GATEWAY_TOKEN_LABEL, HASH_LABEL, JOIN_HASH_LABEL, derive
from llmgw.store import Database, connect, migrate
from llmgw.store.usage_post import Post

from .leader import Leadership
from .metrics import ControlMetrics
from .settings import CONFIG_ENV, ServerConfig, Settings, decode_config

if TYPE_CHECKING:
    from llmgw.admin.app import AdminApp
    from llmgw.admin.route import Route

log = logging.getLogger("llmgw.control")

# One line per part that runs beside the admin API (see the module docstring),
# e.g. "llmgw.control.snapshots:attach". Attached in this order, stopped in reverse.
ATTACH: tuple[str, ...] = (
    "llmgw.control.usage:attach",  # first: the limits read cp.used_tokens at attach
    "llmgw.control.snapshots:attach",
    "llmgw.control.limits:attach",
    "llmgw.control.fleet:attach",  # after snapshots: it adds the replicas to them
)


def token_digest(token: str) -> bytes:
    """What a presented token is compared by (the token itself is not kept in memory)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class ControlPlane:
    """The control plane's state: the store, the secrets derived from the cluster secret, the
    settings, and the slots other parts attach to. `Request.state` is this object."""

    def __init__(self, config: ServerConfig, routes: Sequence[Route]) -> None:
        self.config = config
        self.routes = tuple(routes)
        """The route table the admin app mounts (and the OpenAPI document describes)."""
        self.settings: Settings = config.settings
        self.data_dir = Path(config.data_dir)
        self.secret = b""
        self.hash_key = b""
        """The key of the API keys' keyed hash (`derive(secret, "llmgw api-key hash v1")`)."""
        self.join_hash_key = b""
        """The key of the join tokens' keyed hash (`derive(secret, JOIN_HASH_LABEL)`)."""
        self.gateway_token = ""
        """What gateways send as `Authorization: Bearer` to /internal/v1/*."""
        self.admin_token_digest = b""
        self.gateway_token_digest = b""
        # Slots other parts fill in their attach function.
        self.snapshots: Any = None
        self.limits: Any = None
        self.usage: Any = None
        self.fleet: Any = None
        """The fleet: nodes, models, replicas and the reconcile loop (control/fleet.py)."""
        self.wake: Callable[[str], Awaitable[Any]] | None = None
        """Scale from zero for POST /internal/v1/wake (set by control/fleet.py)."""
        self.ingest_usage: Callable[[Post], Awaitable[None]] | None = None
        """Stores one gateway batch (set by control/usage.py)."""
        self.used_tokens: Callable[[str, float], Awaitable[int]] | None = None
        """Tokens a key or project used since a time (set by control/usage.py)."""
        self.leadership: Leadership | None = None
        """This process's role and the leader it knows (after `start()`)."""
        self._db: Database | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        """The parts' tasks: they run while this process leads."""
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._base: list[asyncio.Task[Any]] = []
        """The lease loop: runs for the whole process."""
        self._agent_server: Any = None
        self.metrics = ControlMetrics(self)
        """What GET /metrics answers; parts count their work into it."""

    @property
    def db(self) -> Database:
        """The open store (after `start()`)."""
        if self._db is None:
            raise RuntimeError("the control plane has not started: call start() first")
        return self._db

    async def start(self) -> None:
        """Reads the secrets, opens and migrates the store, opens the agent port and starts
        the lease loop, which attaches every part in ATTACH once this process leads.

        On SQLite the parts are attached before this returns (the single control plane
        answers its first request as the leader); on PostgreSQL a standby answers at once.
        """
        from llmgw.control import agents

        self.secret = datadir.read_secret(self.data_dir)
        self.hash_key = derive(self.secret, HASH_LABEL)
        self.join_hash_key = derive(self.secret, JOIN_HASH_LABEL)
        self.gateway_token = derive(self.secret, GATEWAY_TOKEN_LABEL).hex()
        self.gateway_token_digest = token_digest(self.gateway_token)
        self.admin_token_digest = token_digest(datadir.read_admin_token(self.data_dir))
        self._db = await connect(self.config.store)
        await migrate(self._db)
        s = self.settings
        agent_address = s.advertise_agent_address or f"{s.agent_host}:{s.agent_port}"
        admin_url = s.advertise_admin_url or f"http://{self.config.host}:{self.config.port}"
        self.leadership = Leadership(self._db, s.leader_lease_ttl, admin_url, agent_address,
                                     on_elected=self._attach, on_deposed=self._detach)
        if self.leadership.single:
            await self.leadership.lead_alone()
        else:
            # One round before the listener opens: a control plane alone on its store
            # answers its first request as the leader, not with a standby's 503.
            await self.leadership.attempt()
            loop = asyncio.get_running_loop()
            task = loop.create_task(self.leadership.run(), name="leader-lease")
            task.add_done_callback(self._task_done)  # a crash is logged
            self._base.append(task)
        # After the first round, so that an agent's first stream finds the role decided.
        self._agent_server = await agents.serve(self, s, self.data_dir, self.join_hash_key,
                                                self.config.agent_ports_held)

    async def _attach(self) -> None:
        for name in ATTACH:
            module, _, func = name.partition(":")
            attach: Callable[[ControlPlane], Awaitable[None]] = getattr(
                importlib.import_module(module), func)
            await attach(self)

    async def _detach(self) -> None:
        """Stops every part (a leader that lost its lease, or a stop): tasks cancelled first,
        so the fleet places nothing more, then the stop hooks (the fleet's closes the
        agents' streams), then the slots emptied so no handler reaches a stopped part."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fn in reversed(self._on_stop):
            try:
                await fn()
            except Exception:
                # One part failing to stop must not keep the others from flushing.
                log.exception("a control plane stop hook failed")
        self._on_stop.clear()
        self.snapshots = self.limits = self.usage = self.fleet = None
        self.wake = None
        self.ingest_usage = None
        self.used_tokens = None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Runs a background task until `stop()` (which cancels it); a crash is logged."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("control plane task %s failed", task.get_name(), exc_info=task.exception())

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Runs `fn` at `stop()`, after the tasks are cancelled, in reverse order of registration."""
        self._on_stop.append(fn)

    async def stop(self) -> None:
        """Stops the lease loop and every part, gives the lease up, closes the agent port and
        the store."""
        for t in self._base:
            t.cancel()
        await asyncio.gather(*self._base, return_exceptions=True)
        self._base.clear()
        await self._detach()
        if self.leadership is not None:
            await self.leadership.release()
        if self._agent_server is not None:
            await self._agent_server.stop(1)
            self._agent_server = None
        if self._db is not None:
            await self._db.close()
            self._db = None


def create_app() -> AdminApp:
    """Granian's factory: the admin app over the route table, configured from the environment."""
    from llmgw.admin.app import AdminApp
    from llmgw.admin.table import ROUTES
    from llmgw.net.serving import settle_worker_heap

    config = decode_config(os.environ[CONFIG_ENV])
    settle_worker_heap()
    return AdminApp(ControlPlane(config, ROUTES))
