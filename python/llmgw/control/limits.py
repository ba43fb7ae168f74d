"""The limits authority: the one place, in the control plane's memory, where limits are counted.

Gateways forward a request only against what they leased from here (see
`llmgw.protocol.wire.LeaseAsk`), in small amounts, per key and per project:

- rpm: request units. A unit counts in the scope's 60-second sliding window from
  the moment it is granted; units given back unused leave it again. So requests
  forwarded in any 60 s <= rpm, whatever the number of gateways. A gateway that
  dies keeps its units counted until they age out: the error only ever refuses.
- concurrency: slots. Slots held over all gateways <= the limit. A gateway that
  stops calling for `reclaim_after` seconds loses its slots, and one that has had no
  answer for about that long gives them up itself (`LeaseReply.reclaim_after` tells it
  when) and starts no request on them. The one way past this limit is the requests a
  gateway cut off from the control plane had running then: they run to their end,
  counted against the slots it is granted after.
- tpm and budgets: tokens. A request takes its estimate (prompt bytes / 4 +
  max_tokens) from tokens leased like units (counted in the tpm window and the
  period's budget when granted, given back when unused); what a request uses beyond
  its estimate is reported and counted then. Past the limit by at most, per gateway
  worker and scope, one request (a share with a few tokens left admits one more)
  plus what requests used beyond their estimate.

Nothing here awaits the database except `used_tokens`, once per scope and budget
period, for the tokens the period had used before this process started.
"""

from __future__ import annotations

import calendar
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from llmgw.protocol.wire import LeaseAsk, LeaseGrant, LeaseReply, LeaseRequest, Limits

WINDOW = 60.0
"""The sliding window of rpm and tpm, in seconds."""

UsedTokens = Callable[[str, float], Awaitable[int]]
"""`used_tokens(scope, period_start)`: tokens a scope used since period_start (the usage rollups)."""

UNITS, TOKENS = 0, 1


def period_start(period: str, now: float) -> float:
    """The start (unix seconds, UTC) of the calendar day, ISO week or month holding `now`."""
    d = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        d -= timedelta(days=d.weekday())
    elif period == "month":
        d = d.replace(day=1)
    return d.timestamp()


def period_end(period: str, start: float) -> float:
    """The start of the period after the one starting at `start`."""
    if period == "day":
        return start + 86400.0
    if period == "week":
        return start + 7 * 86400.0
    d = datetime.fromtimestamp(start, UTC)
    return start + calendar.monthrange(d.year, d.month)[1] * 86400.0


class _Window:
    """Amounts counted over the last 60 s: [at, counted, granted] entries, oldest first."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: deque[list[float]] = deque()
        self.total = 0.0

    def prune(self, now: float) -> None:
        edge = now - WINDOW
        e = self.entries
        while e and e[0][0] <= edge:
            self.total -= e.popleft()[1]

    def add(self, now: float, n: float) -> list[float]:
        entry = [now, n, n]
        self.entries.append(entry)
        self.total += n
        return entry

    def frees_in(self, limit: float, need: float, now: float) -> float:
        """Seconds until `need` more fit under `limit`."""
        excess = self.total + need - limit
        for at, n, _ in self.entries:
            excess -= n
            if excess <= 0:
                return max(at + WINDOW - now, 0.001)
        return WINDOW


@dataclass
class _Scope:
    """What one key or project has used, over every gateway."""

    limits: Limits
    units: _Window = field(default_factory=_Window)
    tokens: _Window = field(default_factory=_Window)
    slots: dict[str, int] = field(default_factory=dict)
    """Gateway id -> slots it holds."""
    slots_held: int = 0
    budget_start: float | None = None
    budget_used: float = 0

    def budget_add(self, n: float, now: float) -> None:
        lim = self.limits
        if lim.budget_tokens is None:
            return
        start = period_start(lim.budget_period, now)
        if self.budget_start != start:
            self.budget_start, self.budget_used = start, 0
        self.budget_used += n

    def budget_left(self, now: float) -> float | None:
        lim = self.limits
        if lim.budget_tokens is None:
            return None
        start = period_start(lim.budget_period, now)
        used = self.budget_used if self.budget_start == start else 0
        return lim.budget_tokens - used


def _idle(sc: _Scope, now: float) -> bool:
    sc.units.prune(now)
    sc.tokens.prune(now)
    return not sc.units.entries and not sc.tokens.entries


@dataclass
class _Gateway:
    last_seen: float
    leases: dict[int, tuple[_Scope, int, list[float]]] = field(default_factory=dict)
    """Lease id -> (scope, UNITS or TOKENS, its window entry), oldest first, kept 60 s."""


class LimitsAuthority:
    """Grants units, tokens and slots so that no limit is passed over all gateways."""

    def __init__(self, used_tokens: UsedTokens | None = None, *, ttl: float = 1.0,
                 reclaim_after: float = 5.0, heartbeat: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.used_tokens = used_tokens
        self.ttl = ttl
        """How long granted units and tokens may be used before they go back."""
        self.reclaim_after = reclaim_after
        self.heartbeat = heartbeat
        self.clock = clock
        self.scopes: dict[str, _Scope] = {}
        self.gateways: dict[str, _Gateway] = {}
        self._next_lease = 0
        self._next_prune = 0.0
        # What it did since it started (this process's lead), for /metrics.
        self.granted = {"units": 0, "tokens": 0, "slots": 0}
        """Amounts granted, by kind."""
        self.refused = {"rpm": 0, "tpm": 0, "concurrency": 0, "budget": 0}
        """Asks refused, by the limit that refused them."""
        self.reclaimed = 0
        """Slots taken back from gateways that went silent."""

    async def lease(self, req: LeaseRequest) -> LeaseReply:
        """Answers one gateway's lease call (POST /internal/v1/leases)."""
        now = self.clock()
        if now >= self._next_prune:
            # Scopes with nothing in their windows (idle a minute) and no slot are forgotten;
            # a budget is then read again from the usage rollups, which by then hold every
            # request it had admitted. Before the budgets are loaded, never between.
            self._next_prune = now + 10.0
            for name in [n for n, sc in self.scopes.items() if not sc.slots_held and _idle(sc, now)]:
                del self.scopes[name]
        for ask in req.asks:
            lim = ask.limits
            if lim.budget_tokens is None or self.used_tokens is None:
                continue
            start = period_start(lim.budget_period, now)
            sc = self._scope(ask.scope, lim)
            if sc.budget_start != start:
                used = await self.used_tokens(ask.scope, start)
                if sc.budget_start != start:  # another call may have loaded it meanwhile
                    sc.budget_start, sc.budget_used = start, used
        return self.lease_now(req, self.clock())

    def lease_now(self, req: LeaseRequest, now: float) -> LeaseReply:
        """The synchronous core of `lease` (budgets not loaded start from 0)."""
        self.sweep(now)
        gw = self.gateways.get(req.gateway_id)
        if gw is None:
            gw = self.gateways[req.gateway_id] = _Gateway(now)
        gw.last_seen = now
        leases = gw.leases
        while leases:
            first = next(iter(leases))
            if leases[first][2][0] > now - WINDOW:
                break
            del leases[first]
        grants = [self._one(gw, req.gateway_id, ask, now) for ask in req.asks]
        granted = self.granted
        for g in grants:
            if g.denied is not None:
                self.refused[g.denied] = self.refused.get(g.denied, 0) + 1
            else:
                granted["units"] += g.units
                granted["tokens"] += g.tokens
                granted["slots"] += g.slots
        return LeaseReply(grants=grants, heartbeat=self.heartbeat, reclaim_after=self.reclaim_after)

    def _scope(self, name: str, limits: Limits) -> _Scope:
        sc = self.scopes.get(name)
        if sc is None:
            sc = self.scopes[name] = _Scope(limits)
        else:
            sc.limits = limits
        return sc

    def _give_back(self, gw: _Gateway, lease: int, unused: int, now: float) -> None:
        held = gw.leases.get(lease)
        if held is None:
            return
        sc, kind, entry = held
        counted = entry[2] - min(unused, entry[2])
        if counted >= entry[1]:
            return  # only ever counted down: a repeated call changes nothing
        back = entry[1] - counted
        entry[1] = counted
        window = sc.units if kind == UNITS else sc.tokens
        if entry[0] > now - WINDOW:
            window.total -= back
        if kind == TOKENS and sc.budget_start == period_start(sc.limits.budget_period, entry[0]):
            sc.budget_used -= back

    def _one(self, gw: _Gateway, gid: str, ask: LeaseAsk, now: float) -> LeaseGrant:
        sc = self._scope(ask.scope, ask.limits)
        sc.units.prune(now)
        sc.tokens.prune(now)
        lim = sc.limits
        # What comes back and what is reported first: it may make room for what is asked.
        for lease, unused in ask.back.items():
            self._give_back(gw, lease, unused, now)
        if ask.tokens_over > 0:
            sc.tokens.add(now, ask.tokens_over)
            sc.budget_add(ask.tokens_over, now)
        held = sc.slots.get(gid, 0)
        if ask.slots_held != held:
            sc.slots_held += ask.slots_held - held
            if ask.slots_held:
                sc.slots[gid] = ask.slots_held
            else:
                sc.slots.pop(gid, None)
        grant = LeaseGrant(scope=ask.scope)
        # All or nothing: a request needs every kind it asks for, and a part granted
        # alone would sit unused in the gateway while refusing others.
        slots = units = tokens = 0
        if ask.slots > 0 and lim.concurrency is not None:
            slots = min(ask.slots, lim.concurrency - sc.slots_held)
            if slots <= 0:
                grant.denied, grant.retry_after = "concurrency", 1.0
                return grant
        if ask.units > 0 and lim.rpm is not None:
            units = min(ask.units, int(lim.rpm - sc.units.total))
            if units <= 0:
                grant.denied, grant.retry_after = "rpm", sc.units.frees_in(lim.rpm, 1, now)
                return grant
        if ask.tokens > 0:
            tokens = ask.tokens
            left = sc.budget_left(now)
            if left is not None:
                if left < 1:
                    end = period_end(lim.budget_period, period_start(lim.budget_period, now))
                    grant.denied, grant.retry_after = "budget", max(end - now, 1.0)
                    return grant
                tokens = min(tokens, int(left))
            if lim.tpm is not None:
                room = int(lim.tpm - sc.tokens.total)
                if room < 1:
                    grant.denied, grant.retry_after = "tpm", sc.tokens.frees_in(lim.tpm, 1, now)
                    return grant
                tokens = min(tokens, room)
        if slots:
            sc.slots[gid] = sc.slots.get(gid, 0) + slots
            sc.slots_held += slots
            grant.slots = slots
        if units:
            grant.lease, grant.units = self._record(gw, sc, UNITS, sc.units.add(now, units)), units
        if tokens:
            sc.budget_add(tokens, now)
            grant.tokens_lease, grant.tokens = self._record(gw, sc, TOKENS, sc.tokens.add(now, tokens)), tokens
        if units or tokens:
            grant.ttl = self.ttl
        return grant

    def _record(self, gw: _Gateway, sc: _Scope, kind: int, entry: list[float]) -> int:
        self._next_lease += 1
        gw.leases[self._next_lease] = (sc, kind, entry)
        return self._next_lease

    def sweep(self, now: float) -> None:
        """Reclaims the slots of gateways not heard from for `reclaim_after` seconds."""
        edge = now - self.reclaim_after
        for gid in [g for g, st in self.gateways.items() if st.last_seen < edge]:
            del self.gateways[gid]
            for sc in self.scopes.values():
                taken = sc.slots.pop(gid, 0)
                sc.slots_held -= taken
                self.reclaimed += taken

    def in_flight(self, scope: str) -> int:
        """Slots held for a scope over all gateways (after reclaiming those of silent gateways)."""
        self.sweep(self.clock())
        sc = self.scopes.get(scope)
        return 0 if sc is None else sc.slots_held

    def window_units(self, scope: str) -> float:
        """Request units counted in a scope's current 60 s window."""
        sc = self.scopes.get(scope)
        if sc is None:
            return 0
        sc.units.prune(self.clock())
        return sc.units.total

    def window_tokens(self, scope: str) -> float:
        """Tokens counted in a scope's current 60 s window."""
        sc = self.scopes.get(scope)
        if sc is None:
            return 0
        sc.tokens.prune(self.clock())
        return sc.tokens.total

    def budget_used(self, scope: str) -> float:
        """Tokens counted in the scope's current budget period (granted + over - returned)."""
        sc = self.scopes.get(scope)
        return 0 if sc is None else sc.budget_used


async def attach(cp: Any) -> None:
    """Control plane part (see `llmgw.control.server.ATTACH`): `cp.limits`.

    Budgets start from `cp.used_tokens(scope, period_start)` when the usage store
    provides it (else from 0 at each start of the control plane).
    """
    cp.limits = LimitsAuthority(used_tokens=getattr(cp, "used_tokens", None))
