"""Driving the chat workload: N concurrent sessions, each a user's turns in order.

Each of `concurrency` workers takes the next user and sends its turns one after
another (turn k+1 only once turn k's answer is complete, as a chat client does),
streamed, then takes the next user. Where each request goes is asked of a
`Router` per request: a fixed URL for a gateway, a replica for the oracle.

The request path, the TTFT and latency measurement and the summary are the
load generator's own (`bench.load`), so the figures mean what they mean there.
A run is bounded by the workload's request count and by `duration` seconds, and
stops by itself.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bench.load import LoadResult, LoadSpec, _error_kind, _one, _Run, summarise
from bench.workload import Workload
from llmgw.net.client import Pool, UpstreamError
from llmgw.net.deadlines import Deadlines

CHAT_PATH = "/v1/chat/completions"


class Router(Protocol):
    """Where each request goes: `route` picks a port, `release` is called when it finished."""

    def route(self, body: bytes) -> int: ...

    def release(self, port: int) -> None: ...


@dataclass
class Fixed:
    """Every request to one port (a gateway, or vllm-router)."""

    port: int

    def route(self, body: bytes) -> int:
        return self.port

    def release(self, port: int) -> None:
        pass


@dataclass
class ByReplica:
    """Adapts a replica-index router (the oracle) to ports."""

    ports: list[int]
    pick: Callable[[bytes], int]
    done: Callable[[int], None]

    def route(self, body: bytes) -> int:
        return self.ports[self.pick(body)]

    def release(self, port: int) -> None:
        self.done(self.ports.index(port))


def head(port: int, body: bytes, api_key: str = "bench") -> bytes:
    """The HTTP/1.1 request head of one chat body to 127.0.0.1:port."""
    return (
        f"POST {CHAT_PATH} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\nauthorization: Bearer {api_key}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()


async def run_sessions(
    workload: Workload,
    router: Router,
    *,
    concurrency: int,
    duration: float,
    timeout: float = 30.0,
) -> LoadResult:
    """Runs the whole workload (or what fits in `duration` s); returns the load summary."""
    if concurrency < 1 or duration <= 0:
        raise ValueError("concurrency must be >= 1 and duration > 0: a run must stop by itself")
    spec = LoadSpec(
        url="http://127.0.0.1",
        model=workload.spec.model,
        concurrency=concurrency,
        requests=workload.requests,
        duration=duration,
        stream=True,
        max_tokens=workload.spec.max_tokens,
        timeout=timeout,
    )
    run = _Run(spec)
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)  # every worker's waits on one wheel
    users = iter(range(len(workload.bodies)))
    run.start = time.perf_counter()
    run.end = run.start + duration

    async def worker() -> None:
        pools: dict[int, Pool] = {}  # one keep-alive connection per port this worker used
        try:
            for u in users:
                for body in workload.bodies[u]:
                    if not run.take():
                        return
                    port = router.route(body)
                    pool = pools.get(port)
                    if pool is None:
                        pool = pools[port] = Pool(loop, "127.0.0.1", port, max_idle=1, deadlines=deadlines)
                    try:
                        await _one(run, pool, head(port, body), body)
                    except (UpstreamError, OSError, TimeoutError) as e:
                        run.errors[_error_kind(e)] += 1
                    finally:
                        router.release(port)
        finally:
            for p in pools.values():
                p.close()

    cpu0 = os.times()
    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    # Turns still in flight `grace` s after the end are cut, as in a time-bounded load.
    _, pending = await asyncio.wait(tasks, timeout=duration + spec.grace)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
        run.cut = run.issued - run.done
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]  # a bug in the driver, not a target's error
    elapsed = time.perf_counter() - run.start
    cpu1 = os.times()
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed if elapsed > 0 else 0.0
    return summarise(run, elapsed, cpu)
