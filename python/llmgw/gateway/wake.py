"""Scale from zero on one gateway worker: hold requests for a model with no replica until one is ready.

A request for a catalog model that no replica serves asks the control plane to
start one (`POST /internal/v1/wake`) and waits for a snapshot that lists a replica
of it. Every request for that model meanwhile shares the one call and the one wait:
a burst of a hundred requests costs the control plane one wake, not a hundred.
Each request still waits only as long as its own deadline (the model's
`scale_up_timeout` from when it arrived) and as long as its client stays.

When the last request waiting for a model gives up, the wake is forgotten: the
next request asks again. That is safe because the call is idempotent (the control
plane wants one replica, however often it is asked) and it keeps a long-gone wait
from answering later requests with a stale refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

log = logging.getLogger("llmgw.gateway")

Outcome = Literal["ready", "timeout", "gone", "refused"]

REFUSAL_TTL = 1.0
"""Seconds a refusal answers new requests for the model without asking again: a client
retrying in a loop against a model that cannot be placed does not become a wake storm."""
_BACKOFF_MAX = 2.0


class WakeRefused(Exception):
    """The control plane will not start a replica of the model; the message says why."""


class _Wait:
    """One model's pending wake: the call in flight and the requests waiting on it."""

    __slots__ = ("fut", "refused_at", "task", "waiters")

    def __init__(self, fut: asyncio.Future[str | None]) -> None:
        self.fut = fut
        """None once a replica is routable; the control plane's refusal otherwise."""
        self.task: asyncio.Task[None] | None = None
        self.waiters = 0
        self.refused_at = 0.0


class Waker:
    """The pending wakes of one worker, by model."""

    def __init__(self, loop: asyncio.AbstractEventLoop, call: Callable[[str], Awaitable[None]],
                 served: Callable[[str], bool]) -> None:
        self.loop = loop
        self._call = call
        """Asks the control plane for a replica: returns once it took the wake, raises
        WakeRefused when it will not, anything else when it could not be asked."""
        self._served = served
        self._pending: dict[str, _Wait] = {}
        self.calls = 0
        """Wake calls made (for tests and the log)."""

    async def wait(self, model: str, timeout: float, gone: asyncio.Future[Any] | None = None) -> tuple[Outcome, str]:
        """Waits until a replica of `model` is routable; (outcome, the refusal's sentence).

        `gone` completes when the client disconnects: the wait ends at once then.
        """
        if self._served(model):
            return "ready", ""
        w = self._pending.get(model)
        if w is not None and w.fut.done():
            reason = w.fut.result()
            if reason is not None and self.loop.time() - w.refused_at < REFUSAL_TTL:
                return "refused", reason
            w = None
        if w is None:
            w = self._pending[model] = _Wait(self.loop.create_future())
            w.task = self.loop.create_task(self._ask(model, w))
        w.waiters += 1
        try:
            waits: set[asyncio.Future[Any]] = {w.fut} if gone is None else {w.fut, gone}
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            w.waiters -= 1
            if w.waiters == 0 and not w.fut.done():
                self._forget(model, w)
        if w.fut.done():
            reason = w.fut.result()
            return ("ready", "") if reason is None else ("refused", reason)
        if gone is not None and gone.done():
            return "gone", ""
        return "timeout", ""

    def settle(self, wakeable: Callable[[str], bool]) -> None:
        """After a snapshot: releases the waits whose model a replica now serves, and
        refuses those whose model the catalog no longer lets start on demand."""
        for model, w in list(self._pending.items()):
            if w.fut.done():
                continue
            if self._served(model):
                w.fut.set_result(None)
                self._forget(model, w)
            elif not wakeable(model):
                self._refuse(w, f"model {model!r} was removed from the catalog, or no longer scales "
                                f"from zero, while the request waited for a replica")

    def close(self) -> None:
        """Cancels the wake calls in flight (the worker stops)."""
        for w in self._pending.values():
            if w.task is not None:
                w.task.cancel()
        self._pending.clear()

    def _forget(self, model: str, w: _Wait) -> None:
        if w.task is not None and not w.task.done():
            w.task.cancel()
        if self._pending.get(model) is w:
            del self._pending[model]

    def _refuse(self, w: _Wait, reason: str) -> None:
        if not w.fut.done():
            w.refused_at = self.loop.time()
            w.fut.set_result(reason)

    async def _ask(self, model: str, w: _Wait) -> None:
        # Retried until the control plane takes it or nobody waits any more: a
        # control plane that restarts or fails over must not fail requests that
        # could still be served in time.
        backoff = 0.05
        failures = 0
        while True:
            self.calls += 1
            try:
                await self._call(model)
                log.info("asked the control plane for a replica of model %s (scale from zero)", model)
                return
            except WakeRefused as e:
                log.warning("the control plane will not start a replica of model %s: %s", model, e)
                self._refuse(w, str(e))
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any transport failure is asked again; a refusal is not
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("cannot ask the control plane for a replica of model %s (%s); %d failures "
                                "in a row, retrying", model, e, failures)
            await asyncio.sleep(backoff)  # back-off between attempts, not a poll
            backoff = min(backoff * 2, _BACKOFF_MAX)
