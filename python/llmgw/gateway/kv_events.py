"""Subscribes to each replica's KV-cache events (vLLM's ZMQ publisher) and feeds the Rust index.

Every gateway worker subscribes itself (docs/architecture.md: each worker is a
whole gateway), so the index lives next to the router that reads it and no lookup
crosses a process. Decoding and indexing happen in Rust (`_core.KvIndex.apply`);
this module only moves frames and handles sequence gaps:

- a gap (a batch lost past the publisher's high-water mark, or while we were
  connecting) is filled from the replica's replay socket, from the first
  missing sequence number;
- when replay is impossible (no replay endpoint, no answer, or the batches are
  no longer buffered) the replica's entries are dropped: a stale index routes
  worse than none, and the next batches rebuild it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
import zmq.asyncio

from llmgw.config import Endpoint

log = logging.getLogger("llmgw.gateway")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_TIMEOUT = 2.0


class KvSubscriber:
    """The KV-event subscriptions of one gateway worker."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: Any, endpoints: list[Endpoint]) -> None:
        self.loop = loop
        self.index = index
        self.endpoints = [e for e in endpoints if e.kv_events]
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.replays = 0
        self.replay_failures = 0

    def start(self) -> None:
        """Connects to every replica that publishes KV events."""
        for e in self.endpoints:
            self.add(e)

    def add(self, e: Endpoint) -> None:
        """Follows one more replica's events (one the control plane placed); no-op without any."""
        if not e.kv_events or e.id in self._tasks:
            return
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        self._tasks[e.id] = self.loop.create_task(self._follow(e))

    def remove(self, replica: str) -> None:
        """Stops following a replica that left the table and drops its index entries."""
        t = self._tasks.pop(replica, None)
        if t is not None:
            t.cancel()
            self.index.drop_replica(replica)

    async def _follow(self, e: Endpoint) -> None:
        assert self._ctx is not None and e.kv_events is not None
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.connect(e.kv_events)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) < 3:
                    log.warning("replica %s sent a KV-event message of %d frames; expected 3", e.id, len(frames))
                    continue
                seq = int.from_bytes(frames[-2], "big")
                missing = self.index.apply(e.id, seq, frames[-1])
                if missing is not None:
                    await self._replay(e, missing, seq, frames[-1])
        except asyncio.CancelledError:
            raise
        except Exception:
            # Never let one replica's bad stream stop the worker; its entries go.
            log.exception("KV events of replica %s: subscription failed; dropping its index entries", e.id)
            self.index.drop_replica(e.id)
        finally:
            sub.close(linger=0)

    async def _replay(self, e: Endpoint, start: int, upto: int, current: bytes) -> None:
        """Fills a gap from the replay socket; drops the replica's entries when it cannot."""
        self.replays += 1
        if not e.kv_replay:
            log.warning("replica %s: KV events %d..%d lost and it has no replay endpoint; "
                        "its index entries are dropped until new events rebuild them", e.id, start, upto - 1)
            self._give_up(e, upto, current)
            return
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.connect(e.kv_replay)
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            first = True
            while True:
                async with asyncio.timeout(REPLAY_TIMEOUT):
                    frames = await sock.recv_multipart()
                # [b"", seq, payload] or, since vLLM added it, [b"", topic, seq, payload].
                seq_b, payload = frames[-2], frames[-1]
                if seq_b == END_SEQ:
                    break
                seq = int.from_bytes(seq_b, "big")
                if first and seq != start:
                    raise LookupError(f"replay starts at {seq}, not {start}: the batches are gone")
                first = False
                self.index.apply(e.id, seq, payload)
        except (TimeoutError, LookupError, zmq.ZMQError) as err:
            log.warning("replica %s: KV-event replay from %d failed (%s); its index entries are dropped",
                        e.id, start, err)
            self._give_up(e, upto, current)
        finally:
            sock.close(linger=0)

    def _give_up(self, e: Endpoint, seq: int, payload: bytes) -> None:
        self.replay_failures += 1
        self.index.drop_replica(e.id)
        # Start again from the batch in hand: with no sequence state the index
        # takes it as the first, and later ones follow on in order.
        self.index.apply(e.id, seq, payload)

    async def close(self) -> None:
        """Stops every subscription."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._ctx is not None:
            self._ctx.term()
