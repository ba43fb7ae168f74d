"""The replicas one gateway worker routes to: the Rust router, connection pools and health.

Health has two inputs. Passive: a connect error or a 5xx ejects the replica for
`eject_base * 2**(n-1)` seconds (n = ejections in a row, capped at `eject_max`),
as Envoy's outlier detection does. Active: `/health` is probed every
`probe_interval`; a failed probe takes the replica out until a probe succeeds.
A replica routes again only when both agree.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw import _core
from llmgw.config import Endpoint, Health

from .engine_load import parse_engine_load
from .upstream import Pool, UpstreamError

log = logging.getLogger("llmgw.gateway")


class Replica:
    """One replica's state on this worker."""

    __slots__ = ("ejected_until", "ejections", "endpoint", "index", "pool", "probe_ok", "timer")

    def __init__(self, endpoint: Endpoint, index: int, pool: Pool) -> None:
        self.endpoint = endpoint
        self.index = index
        self.pool = pool
        self.ejections = 0
        self.ejected_until = 0.0
        self.probe_ok = True
        self.timer: asyncio.TimerHandle | None = None

    @property
    def id(self) -> str:
        """The replica's configured id."""
        return self.endpoint.id


class ReplicaSet:
    """The replica table: who serves what, who is healthy, and how to reach them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        endpoints: list[Endpoint],
        health: Health,
        on_ejection: Callable[[str], None] | None = None,
    ) -> None:
        self.loop = loop
        self.health = health
        self.router = _core.Router()
        self.router.set_replicas([(e.id, list(e.models)) for e in endpoints])
        self.replicas = [
            Replica(e, i, Pool(loop, e.host, e.port)) for i, e in enumerate(endpoints)
        ]
        self.models: list[str] = sorted({m for e in endpoints for m in e.models})
        self._on_ejection = on_ejection
        self._probe_task: asyncio.Task[None] | None = None
        self.scrape_load = False
        """Also read each engine's /metrics at every probe (set when a policy weighs engine load)."""

    # -- passive health ------------------------------------------------------------
    def failed(self, r: Replica, why: str) -> None:
        """Ejects a replica after a connect error or 5xx, with growing back-off."""
        r.ejections += 1
        wait = min(self.health.eject_base * 2 ** (r.ejections - 1), self.health.eject_max)
        r.ejected_until = self.loop.time() + wait
        self.router.set_healthy(r.index, False)
        if r.timer is not None:
            r.timer.cancel()
        r.timer = self.loop.call_later(wait, self._restore, r)
        log.warning("replica %s ejected for %.1fs (ejection %d in a row): %s", r.id, wait, r.ejections, why)
        if self._on_ejection is not None:
            self._on_ejection(r.id)

    def succeeded(self, r: Replica) -> None:
        """A good answer ends a run of ejections (cheap when there was none)."""
        if r.ejections and self.loop.time() >= r.ejected_until:
            r.ejections = 0

    def _restore(self, r: Replica) -> None:
        r.timer = None
        if r.probe_ok:
            self.router.set_healthy(r.index, True)

    # -- active health -------------------------------------------------------------
    def start_probes(self) -> None:
        """Starts the probe loop on this worker's event loop."""
        if self.replicas and self._probe_task is None:
            self._probe_task = self.loop.create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(r) for r in self.replicas))
            await asyncio.sleep(self.health.probe_interval)

    async def _probe(self, r: Replica) -> None:
        got = await fetch(r.pool, b"/health", self.health.probe_timeout)
        ok = got is not None and 200 <= got[0] < 300
        if ok and self.scrape_load:
            await self._scrape(r)
        if ok == r.probe_ok:
            return
        r.probe_ok = ok
        if ok:
            log.info("replica %s passes its health probe again", r.id)
            if self.loop.time() >= r.ejected_until:
                self.router.set_healthy(r.index, True)
        else:
            log.warning("replica %s fails its health probe; not routing to it", r.id)
            self.router.set_healthy(r.index, False)

    async def _scrape(self, r: Replica) -> None:
        """Reads the engine's queue and cache use for the policies that weigh them."""
        got = await fetch(r.pool, b"/metrics", self.health.probe_timeout)
        if got is None or got[0] != 200:
            return
        load = parse_engine_load(got[1].decode("utf-8", "replace"))
        if load is not None:
            self.router.set_engine_load(r.index, load.running, load.waiting, load.kv_usage)

    async def close(self) -> None:
        """Stops probes and closes pooled connections."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            try:
                await self._probe_task
            except asyncio.CancelledError:
                pass
        for r in self.replicas:
            if r.timer is not None:
                r.timer.cancel()
            r.pool.close()


async def fetch(pool: Pool, path: bytes, timeout: float) -> tuple[int, bytes] | None:
    """GET a path on a replica over its pool; (status, body), or None when it fails."""
    deadline = pool.loop.time() + timeout
    try:
        ex = await pool.get(timeout)
    except UpstreamError:
        return None
    try:
        ex.send(b"GET " + path + b" HTTP/1.1\r\nHost: " + pool.hostport + b"\r\nUser-Agent: llmgw-probe\r\n\r\n", b"")
        status = await ex.read_head(deadline)
        parts = []
        while (chunk := await ex.read_chunk(timeout, deadline)) is not None:
            parts.append(chunk)
    except UpstreamError:
        ex.close()
        return None
    ex.finish()
    return status, b"".join(parts)
