"""The replicas one gateway worker routes to: the Rust router, connection pools and health.

The table is the configuration's static `endpoints` followed by the replicas the
control plane placed (each snapshot's `replicas`, see `update`). The Rust router
addresses replicas by their position in that table and keeps their state by id
across `set_replicas`; a `Replica` knows its current position (`index`), which
moves when the table changes, and is -1 once it left the table. Requests in flight
keep their `Replica` and finish on it: they release, eject and retry through
`index`, never through a position they saw earlier.

Health has two inputs. Passive: a connect error or a 5xx ejects the replica for
`eject_base * 2**(n-1)` seconds (n = ejections in a row, capped at `eject_max`),
as Envoy's outlier detection does, unless that would take more than
`max_ejection_percent` of one of its models' replicas out of routing (then it is
spared and keeps serving: the failures reach the client instead of a 503 for every
request). Active: `/health` is probed every `probe_interval`; a failed probe takes
the replica out until a probe succeeds, whatever the share. A replica routes again
only when both agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from llmgw import _core
from llmgw.config import Endpoint, HealthChecks
from llmgw.net.client import Pool, UpstreamError, fetch
from llmgw.net.deadlines import Deadlines
from llmgw.protocol.wire import ReplicaEntry

from .engine_load import parse_engine_load
from .fleet import diff_replicas

log = logging.getLogger("llmgw.gateway")


class Replica:
    """One replica's state on this worker."""

    __slots__ = ("ejected_until", "ejections", "endpoint", "entry", "index", "pool", "probe", "probe_ok", "spared",
                 "timer")

    def __init__(self, endpoint: Endpoint, index: int, pool: Pool, entry: ReplicaEntry | None = None) -> None:
        self.endpoint = endpoint
        self.index = index
        """Position in the router's table now; -1 once the replica left it."""
        self.pool = pool
        self.entry = entry
        """What the control plane published (None for a configured endpoint)."""
        self.ejections = 0
        self.ejected_until = 0.0
        self.probe_ok = True
        self.spared = False
        """Its last failure did not eject it (`max_ejection_percent`); logged once a run."""
        self.timer: asyncio.TimerHandle | None = None
        self.probe: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        """The replica's configured or published id."""
        return self.endpoint.id


def endpoint_of(entry: ReplicaEntry) -> Endpoint:
    """The Endpoint a published replica is reached at; raises ValueError on a bad url."""
    return Endpoint(id=entry.id, url=entry.url, models=[entry.model], kv_events=entry.kv_events,
                    kv_replay=entry.kv_replay)


class ReplicaSet:
    """The replica table: who serves what, who is healthy, and how to reach them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        endpoints: list[Endpoint],
        health: HealthChecks,
        on_ejection: Callable[[str], None] | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.loop = loop
        self.deadlines = deadlines if deadlines is not None else Deadlines(loop)
        """The worker's deadlines, which every replica's pool times its waits on."""
        self.health = health
        self.router = _core.Router()
        self.static = [Replica(e, i, Pool(loop, e.host, e.port, deadlines=self.deadlines))
                       for i, e in enumerate(endpoints)]
        self.placed: dict[str, Replica] = {}
        """Replicas from the control plane's snapshot, by id, in the order they came."""
        self.replicas: list[Replica] = []
        """The router's table: `replicas[i].index == i`."""
        self._rebuild()
        self._on_ejection = on_ejection
        self.on_spared: Callable[[str], None] | None = None
        """Told of each failure that did not eject its replica (`max_ejection_percent`)."""
        self._probing = False
        self.scrape_load = False
        """Also read each engine's /metrics at every probe (set when a policy weighs engine load)."""

    def _rebuild(self) -> None:
        # One synchronous step: the router and `replicas` change together, so no
        # request sees a position of one table in the other.
        table = [*self.static, *self.placed.values()]
        self.router.set_replicas([(r.id, list(r.endpoint.models)) for r in table])
        for i, r in enumerate(table):
            r.index = i
        self.replicas = table

    # -- the control plane's replicas ------------------------------------------------
    def update(self, entries: Iterable[ReplicaEntry]) -> tuple[list[Replica], list[Replica]]:
        """Makes the placed replicas those of a snapshot; returns (added, removed).

        A replica whose url, model or engine key changed is removed and added anew. A
        removed one routes no new request from here on; requests in flight on it finish
        over its connections, which are closed as they end.
        """
        d = diff_replicas({i: r.entry for i, r in self.placed.items() if r.entry is not None}, entries,
                          {r.id for r in self.static})
        for rid in d.clashes:
            log.warning("the control plane published replica %s, an id this gateway's configuration "
                        "already uses for an endpoint; the configured endpoint is kept", rid)
        if not d.added and not d.removed:
            return [], []
        removed = [self.placed.pop(rid) for rid in d.removed]
        added: list[Replica] = []
        for entry in d.added:
            try:
                endpoint = endpoint_of(entry)
                pool = Pool(self.loop, endpoint.host, endpoint.port, auth=entry.engine_key,
                            deadlines=self.deadlines)
            except ValueError as e:
                log.warning("the control plane published replica %s, which this gateway cannot route to "
                            "(%s); it is left out", entry.id, e)
                continue
            r = Replica(endpoint, -1, pool, entry)
            self.placed[entry.id] = r
            added.append(r)
        self._rebuild()
        for r in removed:
            self._retire(r)
        for r in added:
            if self._probing:
                self._start_probe(r)
        log.info("replicas placed by the control plane: %d added, %d removed, %d now",
                 len(added), len(removed), len(self.placed))
        return added, removed

    def _retire(self, r: Replica) -> None:
        r.index = -1
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        if r.probe is not None:
            r.probe.cancel()
            r.probe = None
        r.pool.close()

    # -- passive health ------------------------------------------------------------
    def failed(self, r: Replica, why: str) -> None:
        """Ejects a replica after a connect error or 5xx, with growing back-off."""
        if r.index < 0:
            return  # left the table while the request ran: nothing routes to it anyway
        short = self._would_leave_short(r)
        if short is not None:
            if self.on_spared is not None:
                self.on_spared(r.id)
            if not r.spared:
                r.spared = True
                model, left, n = short
                log.warning("replica %s is not ejected (%s): ejecting it would leave %d of the %d replicas of "
                            "model %r routable, below what max_ejection_percent %d keeps; it keeps serving",
                            r.id, why, left, n, model, self.health.max_ejection_percent)
            return
        r.spared = False
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

    def _would_leave_short(self, r: Replica) -> tuple[str, int, int] | None:
        """(model, routable after, replicas) for the first of r's models that ejecting r
        would leave with fewer routable replicas than `max_ejection_percent` keeps; None
        when it may go. A replica already out (a failed probe, an ejection that a request
        still running on it outlived) takes nothing more out."""
        router = self.router
        if not router.is_healthy(r.index):
            return None
        pct = self.health.max_ejection_percent
        for model in r.endpoint.models:
            serving = [x for x in self.replicas if model in x.endpoint.models]
            n = len(serving)
            keep = -(-n * (100 - pct) // 100)  # ceil: at 50, the only replica and one of two stay
            left = sum(1 for x in serving if router.is_healthy(x.index)) - 1
            if left < keep:
                return model, left, n
        return None

    def succeeded(self, r: Replica) -> None:
        """A good answer ends a run of ejections (cheap when there was none)."""
        if r.ejections and self.loop.time() >= r.ejected_until:
            r.ejections = 0
        if r.spared:
            r.spared = False

    def _restore(self, r: Replica) -> None:
        r.timer = None
        if r.probe_ok and r.index >= 0:
            self.router.set_healthy(r.index, True)

    # -- active health -------------------------------------------------------------
    def start_probes(self) -> None:
        """Starts probing every replica, and each one added later, on this worker's loop."""
        self._probing = True
        for r in self.replicas:
            self._start_probe(r)

    def _start_probe(self, r: Replica) -> None:
        if r.probe is None and r.index >= 0:
            r.probe = self.loop.create_task(self._probe_loop(r))

    async def _probe_loop(self, r: Replica) -> None:
        # One task per replica: a replica that times out delays only its own
        # probes, and one that leaves the table takes its task with it.
        while True:
            await self._probe(r)
            await asyncio.sleep(self.health.probe_interval)

    async def _probe(self, r: Replica) -> None:
        got = await _probe_get(r.pool, b"/health", self.health.probe_timeout)
        ok = got is not None and 200 <= got[0] < 300
        if ok and self.scrape_load:
            await self._scrape(r)
        if ok == r.probe_ok or r.index < 0:
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
        got = await _probe_get(r.pool, b"/metrics", self.health.probe_timeout)
        if got is None or got[0] != 200 or r.index < 0:
            return
        load = parse_engine_load(got[1].decode("utf-8", "replace"))
        if load is not None:
            self.router.set_engine_load(r.index, load.running, load.waiting, load.kv_usage)

    async def close(self) -> None:
        """Stops probes and closes pooled connections."""
        self._probing = False
        tasks = [r.probe for r in self.replicas if r.probe is not None]
        for r in self.replicas:
            if r.probe is not None:
                r.probe.cancel()
                r.probe = None
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for r in self.replicas:
            if r.timer is not None:
                r.timer.cancel()
            r.pool.close()


async def _probe_get(pool: Pool, path: bytes, timeout: float) -> tuple[int, bytes] | None:
    """GET a path on a replica over its pool; (status, body), or None when it fails."""
    head = (b"GET " + path + b" HTTP/1.1\r\nHost: " + pool.hostport + b"\r\n" + pool.auth
            + b"User-Agent: llmgw-probe\r\n\r\n")
    try:
        status, _, body = await fetch(pool, head, b"", timeout, timeout)
    except UpstreamError:
        return None
    return status, body
