"""Usage records: one per request, batched off the request path.

The request path only appends to a list. A flush task writes the batch every
`interval` seconds (on the lease loop's ticks when there is one: `follow`); `close()`
writes what is left, so a clean shutdown loses nothing. Two destinations, either or
both: a JSON-lines file (`usage_log`), and the control plane (`ship`): a `UsageBatch` of
the requests still running (opens: those forwarded at least
`proxy.DISCONNECT_WATCH_DELAY` ago), those that ended (finals) and each key's last use,
posted to POST /internal/v1/usage. A batch the control plane did not take is kept and
sent again with the next; past `max_pending` records new ones are dropped and counted,
so an outage cannot exhaust the worker's memory (the opens already sent are then
settled by the control plane as `interrupted`).

Finished requests wait for a post encoded, in one native buffer (`_core.UsageRows`), and
a post takes the head of it as bytes: no record object is kept between posts and nothing
is encoded in a burst when a post leaves. When records go only to the control plane
("rows mode") each is a JSON row, which the proxy writes natively as the request ends
(`rows.finish`, which also does what `ending` does, in the same call).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from llmgw import _core
from llmgw.protocol.wire import NULL, Instant, UsageOpen, UsageRecord, UsageRow

log = logging.getLogger("llmgw.gateway")

__all__ = ["UsageOpen", "UsageRecord", "UsageRow", "UsageSink"]

Ship = Callable[[bytes], Awaitable[None]]

MAX_BATCH_RECORDS = 10_000
"""Records per post at most: an outage's backlog leaves in several posts. Above what a busy
worker ends in a tick (3,000 at 12,000 requests/s), so that each tick is one post: the
control plane pays about a millisecond of CPU per post before its records (waking up, the
HTTP exchange, the transaction), and posts of 2,000 made it two posts a tick."""
MAX_BATCH_BYTES = 16 << 20
"""Bytes per post at most, well under what the control plane reads (32 MiB)."""


class Opening(Protocol):
    """A request that was forwarded: its open is built when a batch leaves, if still running."""

    def usage_open(self) -> UsageOpen: ...


_EMPTY = msgspec.Raw(b"[]")


class _Outgoing(msgspec.Struct, kw_only=True):
    """A `UsageBatch` as a gateway posts it: its finished requests were encoded as each was
    queued, and go as one JSON array, in `rows` or in `finals` (as `UsageBatch` reads them)."""

    gateway_id: str
    opens: list[UsageOpen]
    finals: msgspec.Raw = _EMPTY
    rows: msgspec.Raw = _EMPTY
    key_last_used: dict[str, Instant]


class UsageWatch(Protocol):
    """What the worker's metrics learn of shipping (`metrics.Metrics` is one)."""

    def usage_dropped(self, reason: str, n: int) -> None: ...

    def usage_post_failed(self) -> None: ...

    def usage_pending(self, n: int, most: int) -> None: ...


class BatchRejected(Exception):
    """The control plane answered that this batch is invalid (HTTP 400, 413, 422): never resent."""


CLOSE_DEADLINE = 5.0
"""Longest a clean shutdown keeps trying to hand the last batch to the control plane."""


_DECODERS: dict[type[UsageRecord], msgspec.json.Decoder[list[UsageRecord]]] = {
    UsageRow: msgspec.json.Decoder(list[UsageRow]),
    UsageRecord: msgspec.json.Decoder(list[UsageRecord]),
}


class UsageSink:
    """Collects records and writes them in batches."""

    def __init__(self, path: str | None, interval: float = 0.5, *, ship: Ship | None = None,
                 gateway_id: str = "", max_pending: int = 200_000) -> None:
        self.path = path
        self.interval = interval
        self.ship = ship
        """Posts one encoded UsageBatch to the control plane; None writes the file only."""
        self.queue = _core.UsageRows()
        """Finished requests waiting for a post, each encoded when it was queued: as a
        `record_type` (rows in rows mode, objects otherwise)."""
        self.record_type: type[UsageRecord] = UsageRecord
        """What queued records are: see `_settle_record_type`."""
        self.rows: _core.UsageRows | None = None
        """`queue` in rows mode (records only for the control plane), where the proxy writes
        a request's row natively as it ends; None otherwise."""
        self._settle_record_type()
        self.gateway_id = gateway_id
        self.pending: list[UsageRecord] = []
        self.opens: dict[str, Opening] = {}
        """Request id -> its open, until sent. A request that ends first takes its open out
        (its final says everything the open did): short requests cost one record, not two,
        and never build their open."""
        self.last_used: dict[str, float] = {}
        # The queue keeps both as requests end (`ending`, and the proxy's `rows.finish`),
        # in the call that queues the row.
        self.queue.track(self.opens, self.last_used, max_pending)
        self.failures = 0
        self.watch: UsageWatch | None = None
        """Told of drops, failed posts and what waits, once a post (the worker's metrics)."""
        self._task: asyncio.Task[None] | None = None
        self._encoder = msgspec.json.Encoder()
        self._ticks: asyncio.Event | None = None
        """Set on the ticks of the loop this one follows (`follow`); None: its own timer."""
        self._period = 0.0

    def _settle_record_type(self) -> None:
        # Records that only go to the control plane are rows (JSON arrays, less than half the
        # bytes and the encoding time), written as each request ends; a usage log keeps
        # objects, which a person can read. Decided here and in `start` (the gateway sets
        # `ship` in between), not per request.
        # Nothing is queued before `ship` is set, so the queue never holds both kinds.
        rows_mode = self.ship is not None and self.path is None
        self.record_type = UsageRow if rows_mode else UsageRecord
        self.rows = self.queue if rows_mode else None

    def _queued(self, n: int) -> list[UsageRecord]:
        """The first `n` queued records, decoded."""
        return _DECODERS[self.record_type].decode(self.queue.head(n))

    def waiting(self) -> list[str]:
        """The request ids of finished requests not posted yet, oldest first."""
        return [r.request_id for r in self._queued(len(self.queue))]

    @property
    def max_pending(self) -> int:
        """Records (finished and open) that may wait for the control plane; past it new ones
        are dropped and counted."""
        return self.queue.max_pending

    @property
    def dropped(self) -> int:
        """Records dropped since the last post logged it."""
        return self.queue.dropped

    @dropped.setter
    def dropped(self, n: int) -> None:
        self.queue.dropped = n

    def ending(self, rid: str, key_id: str | None, started_at: float) -> bool:
        """A request ended and its record is about to be queued (`record`; the proxy's
        `rows.finish` does the same as it writes the row): its open is taken out (the final
        says everything the open did, and frees the open's place first) and its key's use
        noted; False when too many records wait (it is dropped, counted)."""
        return self.queue.ending(rid, key_id, started_at)

    @property
    def enabled(self) -> bool:
        """Whether records go anywhere (a usage log or a control plane)."""
        return self.path is not None or self.ship is not None

    def record(self, rec: UsageRecord) -> None:
        """Queues one finished request; never blocks, never awaits."""
        if self.path is not None:
            self.pending.append(rec)
        if self.ship is not None and self.ending(rec.request_id, rec.key_id, rec.started_at):
            kind = self.record_type
            self.queue.push(self._encoder.encode(rec if type(rec) is kind else kind(*msgspec.structs.astuple(rec))))

    def open(self, rid: str, rec: Opening) -> None:
        """Queues a request just forwarded (control plane only); never blocks."""
        if self.ship is None:
            return
        if len(self.queue) + len(self.opens) >= self.max_pending:
            self.dropped += 1
            return
        self.opens[rid] = rec

    def follow(self, period: float) -> Callable[[], None]:
        """Posts on the ticks of another periodic loop, `period` seconds apart, instead of on
        its own timer; returns what that loop calls at each tick.

        The control plane idles between a worker's calls, and each call pays for waking it:
        against a real `llmgw server` a one-record post cost it 0.37 ms of CPU back to back
        and 0.9-1.2 ms with 10-100 ms between posts. The gateway's lease loop
        (`Limiter.run`) and this one each kept their own 0.25 s, so the control plane woke
        twice a tick; following the lease loop, a post and a lease call reach it together.
        A post leaves on the tick nearest to `interval`. Should the ticks stop (every pass
        of the lease loop called early for a waiting request), one leaves `interval +
        period` after the last. Given an `interval` shorter than `period`, it keeps its own
        timer: it would post less often than asked.
        """
        if self.interval < period:
            return lambda: None
        ticks = self._ticks = asyncio.Event()
        self._period = period
        every = round(self.interval / period)
        count = 0

        def tick() -> None:
            nonlocal count
            count += 1
            if count >= every:
                count = 0
                ticks.set()

        return tick

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts the periodic flush."""
        self._settle_record_type()
        if self._task is None:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            ticks = self._ticks
            if ticks is None:
                await asyncio.sleep(self.interval)
            else:
                # A tick that came during the last post is not a reason to post again at once:
                # the next post waits for the next tick, with the lease call it brings.
                ticks.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ticks.wait(), self.interval + self._period)
            self.flush()
            await self.send()

    def flush(self) -> None:
        """Writes what is pending to the file."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        if self.path is None:
            return
        data = b"".join(self._encoder.encode(r) + b"\n" for r in batch)
        try:
            # O_APPEND writes of one buffer keep lines whole when several workers share the file.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            log.error("cannot write usage records to %s (%s); keeping %d for the next try", self.path, e, len(batch))
            self.pending[:0] = batch

    async def send(self, drain: bool = False) -> bool:
        """Posts what is pending to the control plane; False when it must be tried again.

        Only the records pending when it starts (in posts of `MAX_BATCH_RECORDS`), unless
        `drain`: those queued while a post is under way wait for the next tick. Posting them
        at once made a busy worker post back to back, each post carrying what ended during
        the previous one (~50 records at 2,000 req/s instead of ~500 per 0.25 s tick), and
        the control plane paid its per-batch transaction, commit and HTTP exchange ten
        times over.
        """
        if self.ship is None:
            return True
        watch = self.watch
        if self.dropped:
            if watch is not None:
                watch.usage_dropped("backlog", self.dropped)
            log.error("usage: %d records dropped: the control plane has not taken any for a while and %d "
                      "are waiting (usage_max_pending)", self.dropped, self.max_pending)
            self.dropped = 0
        try:
            return await self._send(drain)
        finally:
            if watch is not None:
                watch.usage_pending(len(self.opens) + len(self.queue), self.max_pending)

    async def _send(self, drain: bool) -> bool:
        ship, watch = self.ship, self.watch
        assert ship is not None  # `send` returns before this without a control plane
        # A record's open and final count as one: record() takes the open out as it adds the final.
        left = len(self.opens) + len(self.queue)
        first = True
        while (self.opens or len(self.queue) or self.last_used) and (drain or first or left > 0):
            first = False
            n_open = min(len(self.opens), MAX_BATCH_RECORDS)
            n_final = min(len(self.queue), MAX_BATCH_RECORDS - n_open)
            last_used = dict(self.last_used)
            body = self._batch(n_open, n_final, last_used)
            # Kept bodies can make a batch large: fewer records per post, and a single
            # record still too large for the control plane goes without its bodies.
            while len(body) > MAX_BATCH_BYTES and n_open + n_final > 1:
                if n_final > 1 or not n_open:
                    n_final = max(n_final // 2, 1 if not n_open else 0)
                else:
                    n_open //= 2
                body = self._batch(n_open, n_final, last_used)
            if len(body) > MAX_BATCH_BYTES and n_final:
                rec = self._queued(1)[0]
                log.warning("usage: the bodies of request %s are too large to send (%d bytes); not kept",
                            rec.request_id, len(body))
                self.queue.replace_first(self._encoder.encode(
                    msgspec.structs.replace(rec, request_body=NULL, response_body=None)))
                continue
            # The opens in this body, by id: requests that end during the post remove
            # theirs and new ones are appended, so position alone no longer names them.
            sent = list(itertools.islice(self.opens, n_open))
            try:
                await ship(body)
            except BatchRejected as e:
                # Sending it again would be refused again, and hold up every later record.
                log.error("usage: the control plane refused a batch of %d records (%s); dropped",
                          n_open + n_final, e)
                if watch is not None:
                    watch.usage_dropped("refused", n_open + n_final)
            except Exception as e:  # noqa: BLE001 - kept and sent again, whatever went wrong
                self.failures += 1
                if watch is not None:
                    watch.usage_post_failed()
                if self.failures == 1 or self.failures % 100 == 0:  # not every 0.25 s of an outage
                    log.warning("usage: cannot post %d records to the control plane (%s); kept for the next "
                                "try (%d failures in a row)", len(self.opens) + len(self.queue), e, self.failures)
                return False
            if self.failures:
                log.warning("usage: the control plane takes records again after %d failures", self.failures)
                self.failures = 0
            left -= n_open + n_final
            # Sent (or refused for good): records queued meanwhile were appended after these.
            for rid in sent:
                self.opens.pop(rid, None)
            self.queue.drop_head(n_final)
            for k, t in last_used.items():
                if self.last_used.get(k) == t:
                    del self.last_used[k]
        return True

    def _batch(self, n_open: int, n_final: int, last_used: dict[str, float]) -> bytes:
        opens = [o.usage_open() for o in itertools.islice(self.opens.values(), n_open)]
        done = msgspec.Raw(self.queue.head(n_final))
        batch = (_Outgoing(gateway_id=self.gateway_id, opens=opens, rows=done, key_last_used=last_used)
                 if self.rows is not None else
                 _Outgoing(gateway_id=self.gateway_id, opens=opens, finals=done, key_last_used=last_used))
        return self._encoder.encode(batch)

    async def close(self) -> None:
        """Stops the flush task and writes everything that is left."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_DEADLINE
        while not await self.send(drain=True) and loop.time() < deadline:
            await asyncio.sleep(0.1)  # back-off before the next try, bounded by the deadline
        left = len(self.opens) + len(self.queue)
        if left:
            if self.watch is not None:
                self.watch.usage_dropped("shutdown", left)
            log.error("usage: %d records could not reach the control plane before shutdown", left)
