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

log = logging.getLogger("llmgw.gateway")


class UsageRecord(msgspec.Struct, omit_defaults=False):
    """What one request used and how it went."""

    request_id: str
    model: str
    """The name the client asked for."""
    upstream_model: str
    replica: str | None
    status: str
    """ok, client_error, upstream_error, timeout, cancelled, no_replica."""
    http_status: int
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    usage_estimated: bool
    """True when the upstream never reported usage (it failed or the client left):
    completion_tokens then counts the generated chunks that reached us."""
    ttft_ms: float | None
    duration_ms: float
    finish_reason: str | None
    retries: int
    started_at: float
    route: msgspec.Raw | None = None
    """The router's decision: policy, matched prefix, candidates' scores (JSON from Rust)."""
    principal: str | None = None
    """Who made the request; set by the tenancy issue's authentication."""


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
