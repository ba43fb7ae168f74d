"""Limits on the request path: forward only against what was leased from the control plane.

Per scope (a key, a project) a worker holds a `Share`: request units from its
latest lease (rpm), concurrency slots, and a lease of tokens (tpm, budgets) from
which each request takes its estimate. A request takes what its key's share and
its project's share need, synchronously when both have it. Otherwise it waits for
the next lease call: one call at a time per worker carries what every waiting
request needs, bounded by `wait`; then the fail mode applies (`Unavailable`).

A background loop gives back what is not used (expired or idle units, slots idle
for `idle_return`, token leases once their requests settled), reports tokens used
beyond the estimates, and keeps the authority hearing from this worker while it
holds slots. `llmgw.control.limits` says what each limit guarantees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from llmgw import _core
from llmgw.config.units import spoken_duration
from llmgw.protocol.wire import KeyEntry, LeaseAsk, LeaseGrant, LeaseReply, LeaseRequest, Limits

log = logging.getLogger("llmgw.gateway")

Lease = Callable[[LeaseRequest], Awaitable[LeaseReply]]

NO_LIMITS = Limits()

# How long a refusal is answered locally without asking again: short for concurrency
# (a slot frees whenever a request ends), up to a second for the others, whose
# authority gave an exact time.
_DENIAL_CACHE = {"concurrency": 0.05}
_DENIAL_CACHE_MAX = 1.0

INTERVAL = 0.25
"""Seconds between a worker's periodic lease calls (`Limiter.interval` unless given)."""

FORGET_AFTER = 120.0
"""Seconds after which an unused share that holds nothing is dropped (memory stays bounded)."""

_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute", "concurrency": "concurrent requests",
         "budget": "token budget"}


class Denied(Exception):
    """A limit refuses the request: 429 with Retry-After."""

    def __init__(self, scope: str, limit: str, retry_after: float) -> None:
        self.scope = scope
        self.limit = limit
        self.retry_after = retry_after
        kind, _, ident = scope.partition(":")
        super().__init__(f"the {_WHAT.get(limit, limit)} limit of {kind} {ident} is reached; "
                         f"it frees in {spoken_duration(retry_after)}")


class Unavailable(Exception):
    """The authority did not answer in time: the fail mode decides."""


TokenLease = _core.TokenLease
"""Tokens leased for one scope (`id`, `balance`, `granted`, `until`, `in_flight`); requests
take their estimates and settle what they used."""


class Share(_core.Hold):
    """What this worker holds for one scope: units (rpm), slots (concurrency), tokens (tpm, budget).

    What a request takes from (`has_rpm`, `has_conc`, `metered`, `units`, `units_until`,
    `slots_free`, `last_used`, `tok`) is in the native base, which `_core.admit` and
    `Ticket.release` change in one call each; the rest is the lease calls' bookkeeping.
    """

    __slots__ = ("back", "denied", "denied_until", "lease", "limits", "retired", "retry_at", "scope",
                 "slots_held", "tok_at", "tok_batch", "tok_mark", "tok_over", "unit_batch", "units_at",
                 "units_mark", "want_slots", "want_tokens", "want_units")

    def __init__(self, scope: str, limits: Limits) -> None:
        self.scope = scope
        self.limits = limits
        self.has_rpm = self.has_conc = self.metered = False
        self.set_limits(limits)
        self.units = 0
        self.units_until = 0.0
        self.units_at = -1e9
        """When the latest units were granted."""
        self.unit_batch = self.batch()
        """Units the next lease asks for: grows while grants run out fast (see `grow`)."""
        self.units_mark = 0
        """Units held at the previous pass of the lease loop (or at the grant since): what
        requests took in between says whether the rest lasts until the next pass."""
        self.lease = 0
        self.slots_free = 0
        self.slots_held = 0
        self.tok: TokenLease | None = None
        """The token lease new requests take from."""
        self.tok_batch = self.token_batch()
        """Tokens the next lease asks for beyond what waiting requests need (see `grow_tokens`)."""
        self.tok_at = -1e9
        """When the latest token lease was granted."""
        self.tok_mark = 0
        """The token lease's balance at the previous pass (or at its grant), as `units_mark`."""
        self.retired: list[TokenLease] = []
        """Token leases no longer taken from, waiting for their requests to settle."""
        self.back: dict[int, int] = {}
        """Lease id -> what of it goes back, until the authority acknowledged it."""
        self.tok_over = 0
        self.want_units = 0
        self.want_slots = 0
        self.want_tokens = 0
        self.denied: str | None = None
        self.denied_until = 0.0
        self.retry_at = 0.0
        self.last_used = 0.0

    def set_limits(self, limits: Limits) -> None:
        """Takes the scope's limits from a (new) snapshot."""
        old, self.limits = self.limits, limits
        if limits != old:
            # Batches grow within two seconds' part of the limit and keep their size while
            # the share is quiet: another limit sizes them afresh.
            self.unit_batch = self.batch()
            self.tok_batch = self.token_batch()
        self.has_rpm = limits.rpm is not None
        self.has_conc = limits.concurrency is not None
        self.metered = limits.tpm is not None or limits.budget_tokens is not None
        """Tokens are leased for this scope (it has a tpm or a budget)."""

    def needs(self, now: float) -> tuple[bool, bool, bool]:
        """(units, slot, tokens): what a request would have to wait for (`_core.admit` checks
        the same natively, on every request)."""
        tok = self.tok
        return (
            self.has_rpm and (self.units <= 0 or self.units_until <= now),
            self.has_conc and self.slots_free <= 0,
            # A balance above 0 admits one more request even when its estimate is larger:
            # the bound `llmgw.control.limits` states (one request per worker and scope).
            self.metered and (tok is None or tok.balance <= 0 or tok.until <= now),
        )

    def batch(self) -> int:
        """Units to ask for at first: a small part of the rpm, so idle shares strand little."""
        return _two_seconds(self.limits.rpm or 0, 32)

    def grow(self, now: float) -> None:
        """Doubles `unit_batch` when the last grant ran out within a second of coming.

        A fixed 32 meant a lease call (and every request in flight waiting on it) per 32
        requests: 55 calls a second at 1,800 req/s, which cost the keyed gateway and its
        control plane more CPU than the requests' own limit checks. The bound stays a
        two-second part of the rpm (what `batch` allows a small limit) and 2^16: a bound
        of 4,096 lasted 0.2 s at 20,000 req/s, less than the `interval` between the calls
        that renew it ahead, so requests waited again (as with tokens, `grow_tokens`).
        It stays as it grew when the share goes quiet (see `Limiter._settle`).
        """
        if now - self.units_at < 1.0:
            self.unit_batch = _doubled(self.unit_batch, self.batch(), self.limits.rpm or 0, 1 << 16)

    def _token_limit(self) -> int:
        lim = self.limits
        return min(x for x in (lim.tpm, lim.budget_tokens, 1 << 40) if x is not None)

    def token_batch(self) -> int:
        """Tokens to ask for at first beyond what the waiting requests need."""
        return _two_seconds(self._token_limit(), 100_000)

    def grow_tokens(self, now: float) -> None:
        """Doubles `tok_batch` when the last token lease ran out within a second of coming.

        A hot key spends 100k tokens in a tenth of a second at ~20,000 req/s, before the
        periodic call (every `interval`) can renew it, and every request in flight then
        waited for a lease call: about ten stalls a second. The bound is two seconds of
        the limit (what `batch` allows units) and 2^24 tokens; it stays as it grew when the
        share goes quiet (see `Limiter._settle`).
        """
        if now - self.tok_at < 1.0:
            self.tok_batch = _doubled(self.tok_batch, self.token_batch(), self._token_limit(), 1 << 24)


def is_cut_off(now: float, last_call: float, reclaim_after: float, interval: float) -> bool:
    """Whether the authority may have taken a worker's slots back by `now`: no call of the
    worker (sent at `last_call`) was answered for nearly `reclaim_after`, two passes of its
    lease loop short of it, so that they are given up there before the authority grants
    them to another."""
    return now - last_call >= reclaim_after - 2 * interval


def _two_seconds(per_minute: int, most: int) -> int:
    """Two seconds' part of a per-minute limit, at least 1 and at most `most`."""
    return max(1, min(per_minute // 30, most))


def _doubled(batch: int, first: int, per_minute: int, most: int) -> int:
    """The next batch after one that ran out fast: twice as large, within two seconds' part of
    the limit (and `most`), never below the first batch."""
    return max(first, min(batch * 2, _two_seconds(per_minute, most)))


Ticket = _core.Ticket
"""What one admitted request holds (`slotted`, `leases`, `cost`); `release(tokens)` gives it back."""

FREE = Ticket()
"""The ticket of a request no limit applies to (or admitted by the fail-open mode)."""


class Limiter:
    """One worker's shares of every limited key and project, and its lease calls."""

    def __init__(self, gateway_id: str, lease: Lease, *, wait: float = 0.5, idle_return: float = 0.5,
                 interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.gateway_id = gateway_id
        self.lease = lease
        self.wait = wait
        self.idle_return = idle_return
        self.interval = interval
        self.on_tick: Callable[[], None] | None = None
        """Called at each periodic pass, as its lease call leaves: the usage sink posts on it
        (`UsageSink.follow`), so that the control plane takes both in one wake-up."""
        self.clock = clock
        self.keys: dict[str, Share] = {}
        self.projects: dict[str, Share] = {}
        self.memo: dict[str, tuple[KeyEntry, Limits | None, tuple[Share, ...]]] = {}
        """Key id -> (entry, project limits, their shares) as last worked out: a request of
        the same snapshot's entry skips comparing limits and two dict lookups. The gateway
        passes it to `_core.take` itself, which is `take` without this method's frame."""
        self.heartbeat = 1.0
        self.reclaim_after = 5.0
        """The authority's: see `is_cut_off`."""
        self._last_call = 0.0
        """When the last lease call that was answered was sent."""
        self._round: asyncio.Future[bool] | None = None
        self._kick = asyncio.Event()
        self.failures = 0

    # -- the request path -------------------------------------------------------------
    def _shares(self, entry: KeyEntry, project: Limits | None) -> tuple[Share, ...]:
        memo = self.memo.get(entry.key_id)
        if memo is not None and memo[0] is entry and memo[1] is project:
            return memo[2]
        out: tuple[Share, ...] = ()
        if entry.limits != NO_LIMITS:
            ks = self.keys.get(entry.key_id)
            if ks is None:
                ks = self.keys[entry.key_id] = Share("key:" + entry.key_id, entry.limits)
                ks.last_used = self.clock()
            elif ks.limits is not entry.limits:
                ks.set_limits(entry.limits)
            out = (ks,)
        if project is not None and project != NO_LIMITS:
            ps = self.projects.get(entry.project_id)
            if ps is None:
                ps = self.projects[entry.project_id] = Share("project:" + entry.project_id, project)
                ps.last_used = self.clock()
            elif ps.limits is not project:
                ps.set_limits(project)
            out += (ps,)
        self.memo[entry.key_id] = (entry, project, out)
        return out

    def take(self, entry: KeyEntry, project: Limits | None, cost: int = 1) -> Ticket | None:
        """Admits the request from what is held (no await), or None when a lease call is needed.

        `cost` is the request's token estimate (tpm, budgets). Raises Denied while a
        refusal from the authority still holds.
        """
        now = self.clock()
        # The memo's lookup and `_core.admit` in one native call, for a key seen before with
        # this snapshot's entry (nearly every request); the rest is worked out here.
        ticket = _core.take(self.memo, entry, project, now, cost)
        if ticket is False:
            shares = self._shares(entry, project)
            if not shares:
                return FREE
            ticket = _core.admit(shares, now, cost)
        if ticket is None:
            for t in self._shares(entry, project):
                if t.denied_until > now and t.denied is not None and any(t.needs(now)):
                    raise Denied(t.scope, t.denied, max(t.retry_at - now, 0.0))
        return ticket

    async def acquire(self, entry: KeyEntry, project: Limits | None, cost: int = 1) -> Ticket:
        """Admits the request, waiting for lease calls for at most `wait` seconds.

        Raises Denied (429) or Unavailable (no answer in time: the fail mode decides).
        """
        deadline = self.clock() + self.wait
        loop = asyncio.get_running_loop()
        while True:
            ticket = self.take(entry, project, cost)
            if ticket is not None:
                return ticket
            now = self.clock()
            for s in self._shares(entry, project):
                units, slot, tokens = s.needs(now)
                s.want_units += units
                s.want_slots += slot
                s.want_tokens += cost if tokens else 0
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

    def in_flight(self) -> int:
        """Slots in use by requests of this worker, over all scopes (0 when idle)."""
        return sum(s.slots_held - s.slots_free for d in (self.keys, self.projects) for s in d.values())

    # -- the lease calls --------------------------------------------------------------
    async def close(self) -> None:
        """Gives back everything unused now (clean shutdown), rather than when the authority reclaims it."""
        self.idle_return = 0.0
        self.heartbeat = 0.0
        await self.round_trip()

    async def run(self) -> None:
        """Sends lease calls: at once when a request waits, else every `interval`."""
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.interval)
            except TimeoutError:
                if self.on_tick is not None:
                    self.on_tick()
            self._kick.clear()
            await self.round_trip()

    def _settle(self, s: Share, now: float, quiet: bool, cut_off: bool) -> bool:
        """Moves what is unused into `back` (all of it when the share is `quiet`: unused for
        `idle_return`), and gives its slots up when `cut_off`; True when the authority must
        hear of it."""
        tell = False
        if s.units and (s.units_until <= now or quiet):
            s.back[s.lease] = s.units
            s.units = 0
        # A quiet share gives back what it holds but keeps the batch sizes it grew to. Put
        # back to the first batch, a key that paused and came back at its rate (a client's
        # bursts, the bench's rounds) waited for the batch to double again: eight lease calls
        # from 32 units to 4,096, each stalling every request in flight for the call's round
        # trip (5-20 ms on a busy machine). A batch is at most two seconds' part of the
        # limit, so asking for it after a pause takes no more than the limit's pace allows.
        tok = s.tok
        if tok is not None and (tok.until <= now or quiet or tok.balance <= 0):
            s.retired.append(tok)
            s.tok = None
        if s.retired:
            keep = []
            for t in s.retired:
                if t.in_flight:
                    keep.append(t)
                elif t.balance > 0:
                    s.back[t.id] = t.balance
                elif t.balance < 0:
                    s.tok_over -= t.balance
            s.retired = keep
        if cut_off and s.slots_held:
            # Free slots go, and those in use become a debt that their requests' release pays
            # back: a slot freed now is not used again, and the slots granted after count the
            # requests still running. Those are the one way past the limit (the authority
            # counts them no more); the next answered call reports none held.
            s.slots_free -= s.slots_held
            s.slots_held = 0
            tell = True
        elif s.slots_free > 0 and not s.want_slots and quiet:
            s.slots_held -= s.slots_free
            s.slots_free = 0
            tell = True
        return tell

    def _collect(self, now: float) -> list[tuple[Share, LeaseAsk]]:
        asks: list[tuple[Share, LeaseAsk]] = []
        heartbeat = now - self._last_call >= self.heartbeat / 2
        cut_off = is_cut_off(now, self._last_call, self.reclaim_after, self.interval)
        for d in (self.keys, self.projects):
            for name, s in list(d.items()):
                quiet = now - s.last_used >= self.idle_return
                tell = self._settle(s, now, quiet, cut_off)
                if (now - s.last_used > FORGET_AFTER and s.tok is None and not s.retired and not (
                        s.slots_held or s.units or s.back or s.tok_over or s.want_units or s.want_slots
                        or s.want_tokens)):
                    del d[name]  # a key not used for a while: its share is made again when it is
                    self.memo.clear()
                    continue
                self._renew(s, now, quiet)
                if not (s.want_units or s.want_slots or s.want_tokens or s.back or s.tok_over or tell
                        or (heartbeat and s.slots_held)):
                    continue
                if s.want_units:
                    s.grow(now)
                if s.want_tokens:
                    s.grow_tokens(now)
                asks.append((s, LeaseAsk(
                    scope=s.scope, limits=s.limits, slots_held=s.slots_held,
                    # Requests still running on slots given up while cut off are a debt: a
                    # slot asked for a waiting request must come on top of it.
                    slots=s.want_slots + max(-s.slots_free, 0) if s.want_slots else 0,
                    units=max(s.want_units, s.unit_batch) if s.want_units else 0,
                    tokens=s.want_tokens + s.tok_batch if s.want_tokens else 0,
                    back=dict(s.back), tokens_over=s.tok_over,
                )))
                s.want_units = s.want_slots = s.want_tokens = 0
        return asks

    def _renew(self, s: Share, now: float, quiet: bool) -> None:
        """Asks ahead for what a share in use runs out of before the next periodic call.

        Without it a busy share's units expired (ttl) or its tokens ran out on the request
        path: every request in flight then waited for a lease call (about 450 of 20,000 at
        2,500 req/s, ~2 stalls a second), and each wait cost a future, a timer and a task.
        Asked ahead, the new lease lands while the old one still admits; what is left of
        the old one goes back with the call after (`_apply`), so nothing is counted twice.
        """
        units_taken, s.units_mark = s.units_mark - s.units, s.units
        tok = s.tok
        tokens_taken = 0
        if tok is not None:
            tokens_taken, s.tok_mark = s.tok_mark - tok.balance, tok.balance
        if quiet:
            return
        # What is left must last until the pass after next, before which the lease asked
        # now lands: at the pace of the last interval, a rest under twice what it took runs
        # out first (a quarter of the batch left is too little once a batch lasts under
        # four intervals, and each run-out stalls every request in flight).
        soon = now + self.interval
        if s.has_rpm and s.units and not s.want_units and (
                s.units_until <= soon or s.units * 4 <= s.unit_batch or s.units <= 2 * units_taken):
            s.want_units = 1
        if s.metered and tok is not None and not s.want_tokens and (
                tok.until <= soon or tok.balance * 4 <= tok.granted or tok.balance <= 2 * tokens_taken):
            s.want_tokens = 1

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
        self.reclaim_after = reply.reclaim_after
        for (s, ask), g in zip(asks, reply.grants, strict=False):
            s.tok_over -= ask.tokens_over
            for lease in ask.back:
                s.back.pop(lease, None)
            self._apply(s, g, now)
        if fut is not None:
            fut.set_result(True)

    @staticmethod
    def _apply(s: Share, g: LeaseGrant, now: float) -> None:
        # Expiry counts from before the call: the authority's clock started later, so
        # what was leased always expires here first.
        if g.units:
            if s.units:  # a lease asked for while units were left: those go back
                s.back[s.lease] = s.units
            s.units, s.units_until, s.lease, s.units_at = g.units, now + g.ttl, g.lease, now
            s.units_mark = g.units
        if g.slots:
            s.slots_free += g.slots
            s.slots_held += g.slots
        if g.tokens:
            if s.tok is not None:
                s.retired.append(s.tok)
            s.tok = TokenLease(g.tokens_lease, g.tokens, now + g.ttl)
            s.tok_at = now
            s.tok_mark = g.tokens
        if g.denied is not None:
            wait = g.retry_after or 1.0
            s.denied, s.retry_at = g.denied, now + wait
            s.denied_until = now + min(wait, _DENIAL_CACHE.get(g.denied, _DENIAL_CACHE_MAX))
        elif g.units or g.slots or g.tokens:
            s.denied = None
