"""The agent's time source, injected so that back-off, probes and drain deadlines are tested without waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol


class Clock(Protocol):
    """Monotonic time and sleeping; `RealClock` in production, a fake one in tests."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` on this clock."""
        ...


class RealClock:
    """The process's monotonic clock and asyncio's sleep."""

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep(seconds)`."""
        await asyncio.sleep(seconds)


async def race(clock: Clock, fut: asyncio.Future[Any], seconds: float) -> bool:
    """Wait for `fut` at most `seconds` on `clock`; True when it finished. `fut` is not cancelled."""
    if fut.done():
        return True
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait((fut, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    return fut.done()
