"""The limits authority: the one place, in the control plane's memory, where units are counted.

Gateways forward a request only against units leased from here (see `llmgw.wire.LeaseAsk`):

- a request unit per admission. Every unit granted counts in the scope's 60-second
  sliding window from the moment it is granted; units a gateway gives back unused
  leave the window again. So requests forwarded within any 60 s <= rpm, exactly,
  whatever the number of gateways (a gateway that dies keeps its units counted:
  the error only ever refuses, never admits).
- a concurrency slot per request in flight. Slots held over all gateways <= the
  limit. A gateway that stops calling (`reclaim_after`) loses its slots; this is
  the one way past a limit: a gateway cut off from the control plane for longer
  than that while its requests still run.
- tpm and budgets are gates: units are granted only while the tokens reported in
  the last 60 s (tpm) or in the period (budget) are under the limit. Tokens are
  known when a request ends, so both may be passed by the tokens of the requests
  admitted before the gate closed: those in flight, plus at most one lease of
  units per gateway, held for at most `ttl` seconds.

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

from llmgw.wire import LeaseAsk, LeaseGrant, LeaseReply, LeaseRequest, Limits

WINDOW = 60.0
"""The sliding window of rpm and tpm, in seconds."""

UsedTokens = Callable[[str, float], Awaitable[int]]
"""`used_tokens(scope, period_start)`: tokens a scope used since period_start (the usage rollups)."""


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
    d = datetime.fromtimestamp(start, UTC)
    if period == "day":
        return start + 86400.0
    if period == "week":
        return start + 7 * 86400.0
    days = calendar.monthrange(d.year, d.month)[1]
    return start + days * 86400.0


@dataclass
class _Scope:
    """What one key or project has used, over every gateway."""

    limits: Limits
    window: deque[list[float]] = field(default_factory=deque)
    """[granted_at, units still counted, units granted] per grant, oldest first."""
    in_window: float = 0
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    tokens_in_window: int = 0
    slots: dict[str, int] = field(default_factory=dict)
    """Gateway id -> slots it holds."""
    slots_held: int = 0
    budget_start: float | None = None
    budget_used: int = 0

    def prune(self, now: float) -> None:
        edge = now - WINDOW
        w = self.window
        while w and w[0][0] <= edge:
            self.in_window -= w.popleft()[1]
        t = self.tokens
        while t and t[0][0] <= edge:
            self.tokens_in_window -= t.popleft()[1]

    def rpm_frees_in(self, need: float, now: float) -> float:
        """Seconds until `need` more units fit in the rpm window."""
        rpm = self.limits.rpm or 0
        excess = self.in_window + need - rpm
        for granted_at, n in self.window:
            excess -= n
            if excess <= 0:
                return max(granted_at + WINDOW - now, 0.001)
        return WINDOW

    def tpm_frees_in(self, now: float) -> float:
        """Seconds until the tokens of the last minute drop under tpm."""
        tpm = self.limits.tpm or 0
        excess = self.tokens_in_window - tpm + 1
        for at, n in self.tokens:
            excess -= n
            if excess <= 0:
                return max(at + WINDOW - now, 0.001)
        return WINDOW


@dataclass
class _Gateway:
    last_seen: float
    leases: dict[int, list[float]] = field(default_factory=dict)
    """Lease id -> [granted_at, units counted, units granted] (the entry in the scope's
    window is the same list), oldest first, kept while in the window."""


class LimitsAuthority:
    """Grants request units and concurrency slots so that no limit is passed over all gateways."""

    def __init__(self, used_tokens: UsedTokens | None = None, *, ttl: float = 1.0,
                 reclaim_after: float = 5.0, heartbeat: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.used_tokens = used_tokens
        self.ttl = ttl
        """How long granted units may be used; bounds how long a closed gate still admits."""
        self.reclaim_after = reclaim_after
        self.heartbeat = heartbeat
        self.clock = clock
        self.scopes: dict[str, _Scope] = {}
        self.gateways: dict[str, _Gateway] = {}
        self._next_lease = 0

    async def lease(self, req: LeaseRequest) -> LeaseReply:
        """Answers one gateway's lease call (POST /internal/v1/leases)."""
        now = self.clock()
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
        """The synchronous core of `lease`: budgets not yet loaded start from 0."""
        self.sweep(now)
        gw = self.gateways.get(req.gateway_id)
        if gw is None:
            gw = self.gateways[req.gateway_id] = _Gateway(now)
        gw.last_seen = now
        leases = gw.leases
        while leases:
            first = next(iter(leases))
            if leases[first][0] > now - WINDOW:
                break
            del leases[first]
        grants = [self._one(gw, req.gateway_id, ask, now) for ask in req.asks]
        return LeaseReply(grants=grants, heartbeat=self.heartbeat)

    def _scope(self, name: str, limits: Limits) -> _Scope:
        sc = self.scopes.get(name)
        if sc is None:
            sc = self.scopes[name] = _Scope(limits)
        else:
            sc.limits = limits
        return sc

    def _one(self, gw: _Gateway, gid: str, ask: LeaseAsk, now: float) -> LeaseGrant:
        sc = self._scope(ask.scope, ask.limits)
        sc.prune(now)
        lim = sc.limits
        # Given back and reported first: they may make room for what is asked.
        if ask.lease:
            entry = gw.leases.get(ask.lease)
            if entry is not None:
                counted = entry[2] - min(ask.units_back, entry[2])
                if counted < entry[1]:  # never counted back up: units handed out stay handed out
                    if entry[0] > now - WINDOW:
                        sc.in_window -= entry[1] - counted
                    entry[1] = counted
        held = sc.slots.get(gid, 0)
        if ask.slots_held != held:
            sc.slots_held += ask.slots_held - held
            if ask.slots_held:
                sc.slots[gid] = ask.slots_held
            else:
                sc.slots.pop(gid, None)
        if ask.tokens > 0:
            sc.tokens.append((now, ask.tokens))
            sc.tokens_in_window += ask.tokens
            if lim.budget_tokens is not None:
                start = period_start(lim.budget_period, now)
                if sc.budget_start != start:
                    sc.budget_start, sc.budget_used = start, 0
                sc.budget_used += ask.tokens
        grant = LeaseGrant(scope=ask.scope)
        if ask.units <= 0 and ask.slots <= 0:
            return grant
        denied = self._gate(sc, now)
        if denied is not None:
            grant.denied, grant.retry_after = denied
            return grant
        if ask.slots > 0 and lim.concurrency is not None:
            free = lim.concurrency - sc.slots_held
            if free <= 0:
                grant.denied, grant.retry_after = "concurrency", 1.0
                return grant
            # Slots first: a request needs both, and a slot refused must not burn a unit.
            grant.slots = min(ask.slots, free)
        if ask.units > 0:
            units = ask.units
            if lim.rpm is not None:
                units = min(units, int(lim.rpm - sc.in_window))
                if units <= 0:
                    grant.slots = 0
                    grant.denied, grant.retry_after = "rpm", sc.rpm_frees_in(1, now)
                    return grant
            self._next_lease += 1
            entry = [now, float(units), float(units)]
            sc.window.append(entry)
            sc.in_window += units
            gw.leases[self._next_lease] = entry
            grant.lease, grant.units, grant.ttl = self._next_lease, units, self.ttl
        if grant.slots:
            sc.slots[gid] = sc.slots.get(gid, 0) + grant.slots
            sc.slots_held += grant.slots
        return grant

    def _gate(self, sc: _Scope, now: float) -> tuple[str, float] | None:
        lim = sc.limits
        if lim.budget_tokens is not None:
            start = period_start(lim.budget_period, now)
            if sc.budget_start == start and sc.budget_used >= lim.budget_tokens:
                return "budget", max(period_end(lim.budget_period, start) - now, 1.0)
        if lim.tpm is not None and sc.tokens_in_window >= lim.tpm:
            return "tpm", sc.tpm_frees_in(now)
        return None

    def sweep(self, now: float) -> None:
        """Reclaims the slots of gateways not heard from for `reclaim_after` seconds."""
        edge = now - self.reclaim_after
        for gid in [g for g, st in self.gateways.items() if st.last_seen < edge]:
            del self.gateways[gid]
            for sc in self.scopes.values():
                held = sc.slots.pop(gid, 0)
                sc.slots_held -= held

    def in_flight(self, scope: str) -> int:
        """Slots held for a scope over all gateways."""
        sc = self.scopes.get(scope)
        return 0 if sc is None else sc.slots_held

    def window_units(self, scope: str) -> float:
        """Request units counted in a scope's current 60 s window."""
        sc = self.scopes.get(scope)
        if sc is None:
            return 0
        sc.prune(self.clock())
        return sc.in_window
