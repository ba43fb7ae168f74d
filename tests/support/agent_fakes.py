"""Fakes for the supervisor: a clock that never waits and engine processes the test controls."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from llmgw.agent.process import LineSink
from llmgw.engines.launch import Launch


class FakeClock:
    """Time moves only when something sleeps: each sleep returns at once, the clock advanced."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class FakeProc:
    """An engine that exits when the test (or a signal) says so."""

    def __init__(self, pid: int, sink: LineSink, exit_at_once: int | None, ignore_term: bool) -> None:
        self.pid = pid
        self.sink = sink
        self.signals: list[int] = []
        self.ignore_term = ignore_term
        self.exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        sink(f"engine {pid} starting")
        if exit_at_once is not None:
            sink(f"engine {pid} crashed")
            self.exit.set_result(exit_at_once)

    async def wait(self) -> int:
        return await asyncio.shield(self.exit)

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.exit.done() and not (sig == 15 and self.ignore_term):
            self.exit.set_result(-sig)


class FakeEngines:
    """Spawns FakeProcs; `crash` makes every new one exit with that code at once."""

    def __init__(self) -> None:
        self.procs: list[FakeProc] = []
        self.crash: int | None = None
        self.ignore_term = False
        self.ready = True
        self.launches: list[Launch] = []

    async def spawn(self, launch: Launch, sink: LineSink) -> FakeProc:
        self.launches.append(launch)
        proc = FakeProc(1000 + len(self.procs), sink, self.crash, self.ignore_term)
        self.procs.append(proc)
        return proc

    async def probe(self, launch: Launch) -> bool:
        await asyncio.sleep(0)
        return self.ready


def sync(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(fn)
    def wrapper() -> None:
        asyncio.run(asyncio.wait_for(fn(), 20))

    return wrapper
