"""Leadership: which control plane places replicas, takes agents and answers the admin API.

On PostgreSQL several control planes share one store; the lease in the store
(`llmgw.store.leader`) elects one. The leader renews it every `ttl / 3`; a
standby tries to take it at the same pace and takes it only once it expired
(by the database's clock). On SQLite there is one control plane (`llmgw server`
refuses a second one on the same file) and it is the leader from the start,
with no lease.

Fencing: the leader counts its lease from the moment it *sent* the statement
that took or renewed it (the database set `now + ttl` no earlier than that),
less a `margin` to stop in, so its own deadline is before the store's. When it
cannot renew before that deadline, because the store is slow, unreachable or
says another holder has it, it steps down at once: `on_deposed` stops placing and closes
every agent stream before a standby can take the lease. A stepped-down control
plane is a standby and may be elected again later.

That deadline is checked by the lease loop, which a paused process (SIGSTOP, a
long GC or swap stall) runs only after it wakes, possibly after other tasks
that write. So the leader's fleet writes also go through `fence()`: the store
refuses any write made after the lease moved to a later epoch (or expired), and
the refusal steps this process down at once.

What changes with the role is not done here: `ControlPlane` attaches its parts
(fleet, limits, usage, snapshots) in `on_elected` and detaches them in
`on_deposed`; the admin app forwards to `leader` while this one is a standby.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from llmgw.store import Database
from llmgw.store import leader as lease

log = logging.getLogger("llmgw.control.leader")

Hook = Callable[[], Awaitable[None]]


class Leadership:
    """This process's role and the leader it knows; `cp.leadership`."""

    def __init__(self, db: Database, ttl: float, admin_url: str, agent_address: str,
                 on_elected: Hook, on_deposed: Hook) -> None:
        self.db = db
        self.ttl = ttl
        self.id = secrets.token_hex(6)
        """This process's holder id (a new one per start: a restarted process is a new holder)."""
        self.admin_url = admin_url
        self.agent_address = agent_address
        self.single = db.dialect != "postgres"
        """One control plane on its own store (SQLite): always the leader, no lease."""
        self.is_leader = False
        self.leader: lease.Lease | None = None
        """The lease last read or taken (whoever holds it); None when none is known."""
        self.since = 0.0
        """When this process became leader (unix seconds, its own clock; for display)."""
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._deadline = 0.0
        """monotonic() after which this process must no longer act as leader."""
        self._leader_until = 0.0
        """monotonic() at which the lease last read expires (by the store's clock)."""
        self._stepping_down: asyncio.Task[None] | None = None
        """The step-down a fenced write started (see `fence`), until it is done."""

    @property
    def margin(self) -> float:
        """How long before its lease's end a leader that could not renew steps down: time to
        cancel its tasks and close the agents' streams before a standby may take over."""
        return min(1.0, self.ttl / 10)

    @property
    def every(self) -> float:
        """Seconds between two attempts to take or renew the lease."""
        return self.ttl / 3

    def other_leader(self) -> lease.Lease | None:
        """The live lease of another control plane, which a standby forwards to and sends
        agents to; None when this one leads, is becoming leader, or no leader is known."""
        got = self.leader
        if (self.is_leader or got is None or got.holder == self.id
                or time.monotonic() >= self._leader_until):
            return None
        return got

    def fence(self, db: Database) -> Database:
        """`db` for this term's writes: on PostgreSQL each write succeeds only while this
        process's lease is still the current one (`lease.Fenced`), and a refused write steps
        this process down; on SQLite (one control plane) `db` itself."""
        if self.single or self.leader is None:
            return db
        # A fenced transaction left idle this long (a process paused mid-write) is ended by
        # the store, so it cannot hold a takeover back for longer.
        return lease.Fenced(db, self.leader.epoch, self._fenced, idle_limit=self.every)

    def _fenced(self, why: str) -> None:
        """A write of this term was refused: stop leading now, not at the next lease round.
        The parts are detached in a task of their own, since the writer is one of the tasks
        that detaching cancels."""
        if not self.is_leader:
            return
        log.error("the store refused a write of this leader (%s): another control plane "
                  "leads; stepping down", why)
        self.is_leader = False
        self.leader = None
        self._stepping_down = asyncio.get_running_loop().create_task(
            self._detach_parts(), name="leader-step-down")

    async def _detach_parts(self) -> None:
        await self._on_deposed()

    async def run(self) -> None:
        """Keeps trying to take or renew the lease until cancelled (PostgreSQL); call after
        `attempt()` made the first try."""
        while True:
            pause = self.every
            if self.is_leader:
                # Wake no later than the deadline, so that failed renewals end the term at
                # the deadline itself rather than up to `every` after it.
                pause = min(pause, max(self._deadline - time.monotonic(), 0.0))
            elif (left := self._leader_until - time.monotonic()) > 0:
                # A standby tries again just after the leader's lease runs out rather than
                # up to `every` later, so a dead leader is replaced within one TTL of its
                # last renewal (a live one has renewed by then, and the try just reads it).
                pause = min(pause, left + 0.05)
            await asyncio.sleep(pause)
            await self.attempt()

    async def attempt(self) -> None:
        """One round: take or renew the lease; become leader or step down accordingly."""
        if self._stepping_down is not None:
            # Detached before this process may lead again (a new term attaches fresh parts).
            await asyncio.gather(self._stepping_down, return_exceptions=True)
            self._stepping_down = None
        sent = time.monotonic()
        if self.is_leader and sent >= self._deadline:
            log.error("the leader lease could not be renewed within its %g s; stepping down so "
                      "that no two control planes place replicas", self.ttl)
            await self._deposed()
        try:
            # Bounded by the deadline: a renewal that returns after it is worthless, since a
            # standby may already hold the lease.
            budget = self._deadline - sent if self.is_leader else self.ttl
            async with asyncio.timeout(max(budget, 0.01)):
                got = await lease.take(self.db, self.id, self.admin_url, self.agent_address,
                                       self.ttl)
        except Exception as e:  # noqa: BLE001 - the store's driver raises more than StoreError
            # Still the leader until the deadline: one slow or failed statement is no reason
            # to move every agent; the next attempt (or the deadline) decides.
            if self.is_leader:
                log.warning("could not renew the leader lease: %s",
                            str(e) or "the store did not answer in time")
            else:
                self.leader = None
            return
        if got is not None:
            self.leader = got
            self._deadline = sent + self.ttl - self.margin
            if not self.is_leader:
                await self._elected()
            return
        if self.is_leader:
            log.error("another control plane holds the leader lease; stepping down")
            await self._deposed()
        try:
            read = time.monotonic()
            self.leader = await lease.current(self.db)
            if self.leader is not None:
                self._leader_until = read + self.leader.expires_at - self.leader.now
        except Exception as e:  # noqa: BLE001 - the store's driver raises more than StoreError
            log.warning("cannot read the leader lease: %s", e)
            self.leader = None

    async def lead_alone(self) -> None:
        """SQLite: this process is the one control plane; it leads from now on. A part that
        fails to attach fails the start."""
        assert self.single
        await self._on_elected()
        self.is_leader = True
        self.since = time.time()

    async def _elected(self) -> None:
        log.info("this control plane (%s) is the leader%s", self.id,
                 "" if self.single else f"; lease of {self.ttl:g} s")
        try:
            await self._on_elected()
        except Exception:
            # Half attached is worse than not leading: undo it and let the lease go, so that
            # a healthy standby leads instead (this process tries again at the next round).
            log.exception("this control plane could not start leading; giving the lease up")
            await self._on_deposed()
            self.is_leader = True  # so that release() gives it up
            await self.release()
            self.leader = None
            return
        # Only now: until every part is attached, handlers and agents must not be let in
        # (a standby moment: 503 and refusals, which clients retry).
        self.is_leader = True
        self.since = time.time()

    async def _deposed(self) -> None:
        self.is_leader = False
        self.leader = None
        await self._on_deposed()

    async def release(self) -> None:
        """At a clean stop: gives the lease up so a standby takes over without waiting it out."""
        if self.single or not self.is_leader:
            return
        self.is_leader = False
        try:
            await lease.release(self.db, self.id)
        except Exception as e:  # noqa: BLE001 - best effort at a stop
            log.warning("could not give the leader lease up (%s); a standby takes it when it "
                        "expires", e)
