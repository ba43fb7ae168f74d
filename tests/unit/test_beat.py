"""A gateway worker's lease calls and usage posts leave on one beat (`gateway.beat`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmgw.gateway.beat import Beat
from llmgw.gateway.limits import Limiter
from llmgw.gateway.usage import UsageSink
from llmgw.wire import LeaseReply, LeaseRequest


def test_periods_tick_together_from_the_phase() -> None:
    now = [10.0]
    beat = Beat(phase=0.1, clock=lambda: now[0])
    assert beat.until_next(0.25) == pytest.approx(0.1)  # 10.1 = 0.1 + 40 * 0.25
    assert beat.until_next(0.5) == pytest.approx(0.1)  # every other tick of 0.25
    now[0] = 10.1
    assert beat.until_next(0.25) == pytest.approx(0.25)  # on a beat: the next one, never 0
    now[0] = 10.2
    assert beat.until_next(0.25) == pytest.approx(0.15)
    assert beat.until_next(0.5) == pytest.approx(0.4)
    assert Beat(phase=0.2, clock=lambda: now[0]).until_next(0.25) == pytest.approx(0.25)


def _ticks(usage_beat: Beat, lease_beat: Beat) -> tuple[list[float], list[float]]:
    """When a sink's flushes and a limiter's periodic calls ran, over 0.4 s of 0.05 s ticks."""
    usage: list[float] = []
    lease: list[float] = []

    class Sink(UsageSink):
        def flush(self) -> None:
            usage.append(time.monotonic())
            super().flush()

    class Lim(Limiter):
        async def round_trip(self) -> None:
            lease.append(time.monotonic())

    async def never(req: LeaseRequest) -> LeaseReply:
        raise AssertionError("no lease call: round_trip is replaced")

    async def main() -> None:
        sink = Sink(None, interval=0.05, beat=usage_beat)
        limiter = Lim("gw", never, interval=0.05, beat=lease_beat)
        sink.start(asyncio.get_running_loop())
        task = asyncio.ensure_future(limiter.run())
        await asyncio.sleep(0.4)
        task.cancel()
        ticked = len(usage)
        await sink.close()  # flushes once more, off the beat
        del usage[ticked:]

    asyncio.run(main())
    return usage, lease


def _apart(usage: list[float], lease: list[float]) -> float:
    """The largest distance from a flush to the nearest lease call."""
    return max(min(abs(u - t) for t in lease) for u in usage)


def test_a_worker_posts_usage_as_it_calls_for_leases() -> None:
    beat = Beat()
    usage, lease = _ticks(beat, beat)
    assert len(usage) >= 5 and len(lease) >= 5, (usage, lease)
    # Both loops wait for the same instant: they wake in the same turn of the event loop,
    # however late a loaded machine makes that turn.
    assert _apart(usage, lease) < 0.01
    # Two beats of other phases: the loops do not meet (what the test above would see
    # if the two loops kept their own time).
    usage, lease = _ticks(Beat(phase=0.0), Beat(phase=0.025))
    assert _apart(usage, lease) > 0.015
