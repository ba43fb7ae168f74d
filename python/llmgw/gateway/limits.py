"""Limits on the request path: forward only against units leased from the control plane.

Per scope (a key, a project) a worker holds a `Share`: request units from its
latest lease (usable for the lease's ttl) and concurrency slots. A request takes
one unit, and one slot where a concurrency limit is set, from its key's share
and its project's share, synchronously when both have them. Otherwise it waits
for the next lease call: one call at a time per worker carries what every waiting
request needs, bounded by `wait`; then the fail mode applies (`Unavailable`).

A background loop gives back what is not used (expired units, slots idle for
`idle_return`), reports the tokens of finished requests (tpm, budgets) and keeps
the authority hearing from this worker while it holds slots. The authority's
module (`llmgw.control.limits`) says what each limit guarantees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from llmgw.wire import KeyEntry, LeaseAsk, LeaseGrant, LeaseReply, LeaseRequest, Limits

log = logging.getLogger("llmgw.gateway")

Lease = Callable[[LeaseRequest], Awaitable[LeaseReply]]

NO_LIMITS = Limits()

# How long a refusal is answered locally without asking again. Short for concurrency
# (a slot frees whenever a request ends), up to a second for the others, whose
# authority gave an exact time.
_DENIAL_CACHE = {"concurrency": 0.05}
_DENIAL_CACHE_MAX = 1.0


class Denied(Exception):
    """A limit refuses the request: 429 with Retry-After."""

    def __init__(self, scope: str, limit: str, retry_after: float) -> None:
        self.scope = scope
        self.limit = limit
        self.retry_after = retry_after
        kind, _, ident = scope.partition(":")
        what = {"rpm": "requests per minute", "tpm": "tokens per minute",
                "concurrency": "concurrent requests", "budget": "token budget"}.get(limit, limit)
        super().__init__(f"the {what} limit of {kind} {ident} is reached; it frees in {retry_after:.1f}s")


class Unavailable(Exception):
    """The authority did not answer in time: the fail mode decides."""


class Share:
    """What this worker holds for one scope."""

    __slots__ = ("denied", "denied_until", "last_used", "lease", "lease_back", "limits", "retry_at",
                 "scope", "slots_free", "slots_held", "tokens", "units", "units_back", "units_until",
                 "want_slots", "want_units")

    def __init__(self, scope: str, limits: Limits) -> None:
        self.scope = scope
        self.limits = limits
        self.units = 0
        self.units_until = 0.0
        self.lease = 0
        self.lease_back = 0
        """The lease whose unused units are being given back, and how many."""
        self.units_back = 0
        self.slots_free = 0
        self.slots_held = 0
        self.tokens = 0
        self.want_units = 0
        self.want_slots = 0
        self.denied: str | None = None
        self.denied_until = 0.0
        self.retry_at = 0.0
        self.last_used = 0.0

    def lacks(self, now: float) -> bool:
        """True when a request cannot be admitted from what is held."""
        if self.units <= 0 or self.units_until <= now:
            return True
        return self.limits.concurrency is not None and self.slots_free <= 0

    def batch(self) -> int:
        """Units to ask for at once: a small part of the rpm, so idle shares strand little."""
        rpm = self.limits.rpm
        return 32 if rpm is None else max(1, min(rpm // 30, 32))


class Ticket:
    """What one admitted request holds; given back by `Limiter.release`."""

    __slots__ = ("shares", "slotted")

    def __init__(self, shares: tuple[Share, ...], slotted: tuple[Share, ...]) -> None:
        self.shares = shares
        self.slotted = slotted


FREE = Ticket((), ())
"""The ticket of a request no limit applies to (or admitted by the fail-open mode)."""


class Limiter:
    """One worker's shares of every limited key and project, and its lease calls."""

    def __init__(self, gateway_id: str, lease: Lease, *, wait: float = 0.5, idle_return: float = 0.5,
                 interval: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.gateway_id = gateway_id
        self.lease = lease
        self.wait = wait
        self.idle_return = idle_return
        self.interval = interval
        self.clock = clock
        self.keys: dict[str, Share] = {}
        self.projects: dict[str, Share] = {}
        self.heartbeat = 1.0
        self._last_call = 0.0
        self._round: asyncio.Future[bool] | None = None
        self._kick = asyncio.Event()
        self.failures = 0

    # -- the request path -------------------------------------------------------------
    def _shares(self, entry: KeyEntry, project: Limits | None) -> tuple[Share, ...]:
        out: tuple[Share, ...] = ()
        if entry.limits != NO_LIMITS:
            ks = self.keys.get(entry.key_id)
            if ks is None:
                ks = self.keys[entry.key_id] = Share("key:" + entry.key_id, entry.limits)
            ks.limits = entry.limits
            out = (ks,)
        if project is not None and project != NO_LIMITS:
            ps = self.projects.get(entry.project_id)
            if ps is None:
                ps = self.projects[entry.project_id] = Share("project:" + entry.project_id, project)
            ps.limits = project
            out += (ps,)
        return out

    def take(self, entry: KeyEntry, project: Limits | None) -> Ticket | None:
        """Admits the request from what is held (no await), or None when a lease call is needed.

        Raises Denied while a refusal from the authority still holds.
        """
        shares = self._shares(entry, project)
        if not shares:
            return FREE
        now = self.clock()
        lacking = False
        for s in shares:
            if s.lacks(now):
                if s.denied_until > now and s.denied is not None:
                    raise Denied(s.scope, s.denied, max(s.retry_at - now, 0.0))
                lacking = True
        if lacking:
            return None
        slotted: tuple[Share, ...] = ()
        for s in shares:
            s.units -= 1
            s.last_used = now
            if s.limits.concurrency is not None:
                s.slots_free -= 1
                slotted += (s,)
        return Ticket(shares, slotted)

    async def acquire(self, entry: KeyEntry, project: Limits | None) -> Ticket:
        """Admits the request, waiting for lease calls for at most `wait` seconds.

        Raises Denied (429) or Unavailable (no answer in time: the fail mode decides).
        """
        deadline = self.clock() + self.wait
        loop = asyncio.get_running_loop()
        while True:
            ticket = self.take(entry, project)
            if ticket is not None:
                return ticket
            now = self.clock()
            for s in self._shares(entry, project):
                if s.units <= 0 or s.units_until <= now:
                    s.want_units += 1
                if s.limits.concurrency is not None and s.slots_free <= 0:
                    s.want_slots += 1
            if self._round is None:
                self._round = loop.create_future()
            fut = self._round
            self._kick.set()
            remaining = deadline - now
            if remaining <= 0:
                raise Unavailable("no lease within the deadline")
            try:
                ok = await asyncio.wait_for(asyncio.shield(fut), remaining)
            except TimeoutError:
                raise Unavailable(f"the control plane did not answer within {self.wait:g}s") from None
            if not ok:
                raise Unavailable("the control plane cannot be reached")

    def release(self, ticket: Ticket, tokens: int) -> None:
        """The request ended (whatever way): its slots come back, its tokens are reported."""
        for s in ticket.slotted:
            s.slots_free += 1
        if tokens:
            for s in ticket.shares:
                s.tokens += tokens

    def in_flight(self) -> int:
        """Slots in use by requests of this worker, over all scopes (0 when idle)."""
        return sum(s.slots_held - s.slots_free for d in (self.keys, self.projects) for s in d.values())

    # -- the lease calls --------------------------------------------------------------
    async def run(self) -> None:
        """Sends lease calls: at once when a request waits, else every `interval`."""
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.interval)
            except TimeoutError:
                pass
            self._kick.clear()
            await self.round_trip()

    def _collect(self, now: float) -> list[tuple[Share, LeaseAsk]]:
        asks: list[tuple[Share, LeaseAsk]] = []
        heartbeat = now - self._last_call >= self.heartbeat / 2
        for d in (self.keys, self.projects):
            for s in d.values():
                if s.units and (s.units_until <= now or now - s.last_used >= self.idle_return):
                    s.lease_back, s.units_back, s.units = s.lease, s.units, 0
                if s.slots_free and not s.want_slots and now - s.last_used >= self.idle_return:
                    s.slots_held -= s.slots_free
                    s.slots_free = 0
                    heartbeat = True  # the authority must learn of it
                if not (s.want_units or s.want_slots or s.units_back or s.tokens or (heartbeat and s.slots_held)):
                    continue
                ask = LeaseAsk(scope=s.scope, limits=s.limits, slots_held=s.slots_held, tokens=s.tokens,
                               units=max(s.want_units, s.batch()) if s.want_units else 0,
                               slots=s.want_slots, lease=s.lease_back if s.units_back else 0,
                               units_back=s.units_back)
                s.want_units = s.want_slots = 0
                asks.append((s, ask))
        return asks

    async def round_trip(self) -> None:
        """One lease call with everything pending; wakes the requests waiting for it."""
        now = self.clock()
        asks = self._collect(now)
        fut, self._round = self._round, None
        if not asks:
            if fut is not None:
                fut.set_result(True)
            return
        try:
            reply = await self.lease(LeaseRequest(gateway_id=self.gateway_id, asks=[a for _, a in asks]))
        except Exception as e:  # noqa: BLE001 - whatever the transport raised, the fail mode decides
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("limits: lease call failed (%s); %d in a row", e, self.failures)
            if fut is not None:
                fut.set_result(False)
            return
        self.failures = 0
        self._last_call = now
        self.heartbeat = reply.heartbeat
        for (s, ask), g in zip(asks, reply.grants, strict=False):
            s.tokens -= ask.tokens
            if ask.units_back and s.lease_back == ask.lease:
                s.units_back = 0
            self._apply(s, g, now)
        if fut is not None:
            fut.set_result(True)

    @staticmethod
    def _apply(s: Share, g: LeaseGrant, now: float) -> None:
        if g.units:
            # Counted from before the call: the authority's clock started later, so
            # the units always expire here first.
            s.units, s.units_until, s.lease = g.units, now + g.ttl, g.lease
        if g.slots:
            s.slots_free += g.slots
            s.slots_held += g.slots
        if g.denied is not None:
            wait = g.retry_after or 1.0
            s.denied, s.retry_at = g.denied, now + wait
            s.denied_until = now + min(wait, _DENIAL_CACHE.get(g.denied, _DENIAL_CACHE_MAX))
        elif g.units or g.slots:
            s.denied = None
