"""The control plane's background loops: a step run whenever woken and at least every so often."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("llmgw.control")


async def run_periodically(wake: asyncio.Event, every: float, step: Callable[[], Awaitable[object]],
                           failed: str) -> None:
    """Runs `step` whenever `wake` is set and at least every `every` seconds, forever.

    A step that raises is retried at the next turn; `failed` (a %-format with the number
    of failures in a row) is logged with the traceback for the first failure and every
    60th after it, so that an outage of the store does not flood the log.
    """
    failures = 0
    while True:
        # asyncio.timeout, not wait_for: on 3.11, wait_for whose inner wait has just
        # finished swallows a cancel (gh-86296), and stopping then waits forever for this
        # task (a wake right before a stop hung the control plane's shutdown).
        try:
            async with asyncio.timeout(every):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
        try:
            await step()
            failures = 0
        except Exception:
            failures += 1
            if failures == 1 or failures % 60 == 0:
                log.exception(failed, failures)
