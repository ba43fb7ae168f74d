"""The load generator: N keep-alive HTTP/1.1 connections, one worker task each, on uvloop.

It reuses llmgw's own upstream client (`Pool`/`Exchange`: an asyncio Protocol
parsing with httptools in C) instead of a second HTTP client, so one Python
process drives as much load as the gateway's own relay path can, with no
per-request allocation beyond the response bytes.

A run is bounded by a request count, a duration, or both, and always stops by
itself: workers stop taking new requests at the bound and in-flight requests
have `timeout` seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec

from bench.stats import percentiles
from llmgw.net.client import (
    ConnectFailed,
    Pool,
    UpstreamError,
    UpstreamTimeout,
)
from llmgw.net.deadlines import Deadlines

PROMPT = "Say hello in one short sentence."


class LoadSpec(msgspec.Struct, kw_only=True):
    """What to send: where, how many at once, how many in all and for how long."""

    url: str
    model: str = "sim-model"
    concurrency: int = 1
    requests: int = 0  # 0: bounded by duration only
    duration: float = 0.0  # seconds; 0: bounded by requests only
    stream: bool = False
    rate: float = 0.0  # requests/s over all workers; 0: as fast as answers come
    max_tokens: int = 16
    timeout: float = 30.0
    grace: float = 3.0  # time-bounded runs: seconds past `duration` that in-flight requests get
    api_key: str = "bench"


class LoadResult(msgspec.Struct, kw_only=True):
    """What one load run measured. Times are in milliseconds, rates per second."""

    ok: int
    cut: int  # in flight when a time-bounded round's grace ran out: dropped, not counted
    errors: dict[str, int]
    duration_s: float
    rps: float
    # Percentile dicts and means hold NaN in memory when there is no sample; JSON has null.
    latency_ms: dict[str, float | None]
    ttft_ms: dict[str, float | None]  # streams: time to the first event carrying content
    gap_ms: dict[str, float | None]  # streams: time between consecutive content events
    gap_mean_ms: float | None
    chunks: int
    chunks_per_s: float
    client_cpu: float  # cores this process used: ~1.0 means the generator is the limit


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []


_chunk_dec = msgspec.json.Decoder(_Chunk)


def target_path(url: str) -> tuple[str, int, str]:
    """(host, port, path) of the chat endpoint: a base URL, a /v1 URL or the full path."""
    u = urlsplit(url if "://" in url else "http://" + url)
    if u.scheme != "http":
        raise ValueError(f"only plain http:// URLs are supported, got {url!r}")
    path = u.path.rstrip("/")
    if not path:
        path = "/v1/chat/completions"
    elif path.endswith("/v1"):
        path += "/chat/completions"
    return u.hostname or "127.0.0.1", u.port or 80, path


def build_request(spec: LoadSpec) -> tuple[bytes, bytes]:
    """The request head and body, built once and sent unchanged by every worker."""
    host, port, path = target_path(spec.url)
    payload: dict[str, object] = {
        "model": spec.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": spec.max_tokens,
    }
    if spec.stream:
        payload["stream"] = True
    body = msgspec.json.encode(payload)
    # Any bearer token: keyless endpoints ignore it, gateways that demand one get one.
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {spec.api_key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


def content_events(buf: bytearray) -> tuple[int, bool]:
    """Consumes complete SSE events from `buf`; returns (events with content, saw [DONE])."""
    n, done = 0, False
    if b"\r" in buf:
        buf[:] = buf.replace(b"\r\n", b"\n")
    while True:
        end = buf.find(b"\n\n")
        if end < 0:
            return n, done
        event = bytes(buf[:end])
        del buf[: end + 2]
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            try:
                chunk = _chunk_dec.decode(data)
            except msgspec.DecodeError:
                continue  # error events and comments count as no content
            if any(c.delta is not None and c.delta.content for c in chunk.choices):
                n += 1


class _Run:
    """Shared state of one run: the budget, and the samples every worker appends to."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.issued = 0
        self.end = math.inf
        self.start = 0.0
        self.latency = array("d")
        self.ttft = array("d")
        self.gaps = array("d")
        self.errors: Counter[str] = Counter()
        self.chunks = 0
        self.cut = 0

    def take(self) -> bool:
        """Claims one request from the budget; False when the run is over."""
        if self.spec.requests and self.issued >= self.spec.requests:
            return False
        if time.perf_counter() >= self.end:
            return False
        self.issued += 1
        return True

    @property
    def done(self) -> int:
        return len(self.latency) + sum(self.errors.values())


def _error_kind(e: BaseException) -> str:
    if isinstance(e, ConnectFailed):
        return "connect"
    if isinstance(e, UpstreamTimeout):
        return f"timeout_{e.phase}"
    if isinstance(e, UpstreamError):
        return f"broken_{e.phase}"
    return type(e).__name__


async def _one(run: _Run, pool: Pool, head: bytes, body: bytes) -> None:
    """One request on a pooled connection; records latency or the error's kind."""
    spec = run.spec
    t0 = time.perf_counter()
    loop_deadline = pool.loop.time() + spec.timeout
    ex = await pool.get(spec.timeout)
    try:
        ex.send(head, body)
        status = await ex.read_head(loop_deadline)
        buf = bytearray()
        first = last = 0.0
        chunks = 0
        while (data := await ex.read_chunk(spec.timeout, loop_deadline)) is not None:
            if spec.stream and status == 200:
                buf += data
                n, _ = content_events(buf)
                if n:
                    now = time.perf_counter()
                    if chunks == 0:
                        first = now
                    else:
                        # Events that came in one read share a timestamp: the client saw them at once.
                        run.gaps.append(now - last)
                        for _ in range(n - 1):
                            run.gaps.append(0.0)
                    last = now
                    chunks += n
    except BaseException:
        ex.close()
        raise
    ex.finish()
    if status != 200:
        run.errors[f"http_{status}"] += 1
        return
    run.latency.append(time.perf_counter() - t0)
    if spec.stream:
        if chunks == 0:
            run.errors["no_content"] += 1
            return
        run.ttft.append(first - t0)
        run.chunks += chunks


async def _worker(
    run: _Run, pool: Pool, head: bytes, body: bytes, slot: Callable[[], float]
) -> None:
    while run.take():
        if run.spec.rate:
            delay = slot() - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        try:
            await _one(run, pool, head, body)
        except (UpstreamError, OSError, TimeoutError) as e:
            run.errors[_error_kind(e)] += 1


async def _progress(run: _Run, total: int, tty: bool) -> None:
    """A bar on a TTY, else a plain line every 5 s, on stderr."""
    last_line = time.perf_counter()
    while True:
        await asyncio.sleep(0.25)
        now = time.perf_counter()
        elapsed = now - run.start
        done = run.done
        rps = done / elapsed if elapsed > 0 else 0.0
        if total:
            frac = min(1.0, done / total)
        elif run.end < math.inf:
            frac = min(1.0, elapsed / (run.end - run.start))
        else:
            frac = 0.0
        errs = sum(run.errors.values())
        text = f"{done} done  {rps:,.0f} req/s  {errs} errors"
        if tty:
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r[{bar:<30}] {frac:4.0%} {text}   ")
            sys.stderr.flush()
        elif now - last_line >= 5:
            last_line = now
            print(f"bench: {frac:4.0%} {text}", file=sys.stderr)


async def run_load(spec: LoadSpec, progress: bool = False, warmup: int = 0) -> LoadResult:
    """Runs one bounded load and summarises it. `warmup` requests per worker are not counted."""
    if spec.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if not spec.requests and not spec.duration:
        raise ValueError("give a request count or a duration: a run must stop by itself")
    host, port, _ = target_path(spec.url)
    head, body = build_request(spec)
    loop = asyncio.get_running_loop()
    # One connection per worker, every wait timed on one wheel (a wheel each would arm a
    # loop timer per worker per tick).
    deadlines = Deadlines(loop)
    pools: list[Pool] = [Pool(loop, host, port, max_idle=1, deadlines=deadlines) for _ in range(spec.concurrency)]
    # Open every connection (and warm it) before the clock starts: connect cost is not load.
    warm = _Run(LoadSpec(**{**msgspec.structs.asdict(spec), "requests": 0, "duration": 0.0}))
    warm.end = time.perf_counter() + spec.timeout
    for _ in range(max(warmup, 0)):
        await asyncio.gather(*(_one(warm, p, head, body) for p in pools), return_exceptions=True)
    for p in pools:
        if not p.idle:
            with contextlib.suppress(UpstreamError):  # counted when the worker tries again
                p.put(await p.get(spec.timeout))
    run = _Run(spec)
    run.start = time.perf_counter()
    run.end = run.start + spec.duration if spec.duration else math.inf
    rate = spec.rate
    counter = iter(range(1 << 62))

    def slot() -> float:
        return run.start + next(counter) / rate

    cpu0 = os.times()
    tick = (
        asyncio.create_task(_progress(run, spec.requests, sys.stderr.isatty()))
        if progress
        else None
    )
    try:
        work = asyncio.gather(*(_worker(run, p, head, body, slot) for p in pools))
        if spec.duration:
            # A slow target (LiteLLM under c=256 answers in ~10 s) would otherwise stretch
            # every round by its whole queue; what is still in flight after the grace is cut.
            try:
                await asyncio.wait_for(work, spec.duration + spec.grace)
            except TimeoutError:
                run.cut = run.issued - run.done
        else:
            await work
    finally:
        if tick is not None:
            tick.cancel()
            if sys.stderr.isatty():
                sys.stderr.write("\n")
        for p in pools:
            p.close()
    elapsed = time.perf_counter() - run.start
    cpu1 = os.times()
    return summarise(run, elapsed, (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed)


def _ms(values: array[float]) -> dict[str, float]:
    p = percentiles([v * 1000 for v in values])
    p["mean"] = (sum(values) / len(values) * 1000) if values else math.nan
    return p


def summarise(run: _Run, elapsed: float, client_cpu: float) -> LoadResult:
    """The figures of a finished run."""
    ok = len(run.latency)
    gap_mean = (sum(run.gaps) / len(run.gaps) * 1000) if run.gaps else math.nan
    return LoadResult(
        ok=ok,
        cut=run.cut,
        errors=dict(run.errors),
        duration_s=elapsed,
        rps=ok / elapsed if elapsed > 0 else 0.0,
        latency_ms=_ms(run.latency),
        ttft_ms=_ms(run.ttft) if run.spec.stream else {},
        gap_ms=_ms(run.gaps) if run.spec.stream else {},
        gap_mean_ms=gap_mean,
        chunks=run.chunks,
        chunks_per_s=run.chunks / elapsed if elapsed > 0 else 0.0,
        client_cpu=client_cpu,
    )
