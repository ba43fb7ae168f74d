"""Usage records: one per request, batched off the request path.

The request path only appends to a list. A flush task writes the batch every
`interval` seconds; `close()` writes what is left, so a clean shutdown loses
nothing. Today the sink is a JSON-lines file; the store issue puts the control
plane behind the same `UsageSink.record` seam.
"""

from __future__ import annotations

import asyncio
import logging
import os

import msgspec

from llmgw.wire import UsageRecord

log = logging.getLogger("llmgw.gateway")

__all__ = ["UsageRecord", "UsageSink"]


class UsageSink:
    """Collects records and writes them in batches."""

    def __init__(self, path: str | None, interval: float = 0.5) -> None:
        self.path = path
        self.interval = interval
        self.pending: list[UsageRecord] = []
        self._task: asyncio.Task[None] | None = None
        self._encoder = msgspec.json.Encoder()

    def record(self, rec: UsageRecord) -> None:
        """Queues one record; never blocks, never awaits."""
        self.pending.append(rec)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts the periodic flush."""
        if self._task is None:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.flush()

    def flush(self) -> None:
        """Writes what is pending."""
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

    async def close(self) -> None:
        """Stops the flush task and writes everything that is left."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.flush()
