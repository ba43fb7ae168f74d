"""The gateway worker's side of the control plane: the snapshot long-poll, lease calls, usage posts, wakes.

All four are small HTTP/1.1 exchanges over the gateway's own upstream client
(`upstream.Pool`: uvloop + httptools), with the gateway token. Nothing here runs
on a request's path except `lease`, and that only when a worker's shares are
empty (see `gateway.limits`), and `wake`, for a model with no replica (see `gateway.wake`).

Several control planes (one PostgreSQL, one leader, standbys that forward to it):
every call goes to one of them, the active one, and moves on to the next when it
cannot be reached or answers 503 (a standby with no live leader, a leader that is
stepping down), trying each at most once per call; what the callers already do
when a call fails (the snapshot loop's back-off, usage kept for the next batch,
a lease's fail mode, a wake's retry) is the back-off between rounds. A failed
control plane is skipped for a while (doubling up to `_SKIP_MAX`) unless every
other one failed too, so that a dead leader does not cost each call a connect.
Usage moves across without loss or double counting: a batch that failed is sent
again, whole, to the next one, and the store keeps one row per request id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec

from llmgw.config import ControlPlaneLink
from llmgw.net.client import Pool, UpstreamError, fetch
from llmgw.protocol.wire import LeaseReply, LeaseRequest, Snapshot, WakeRequest

from .credentials import Credentials
from .usage import BatchRejected
from .wake import WakeRefused

log = logging.getLogger("llmgw.gateway")

LEASE_TIMEOUT = 2.0
USAGE_TIMEOUT = 10.0
WAKE_TIMEOUT = 5.0
_BACKOFF_MAX = 1.0
_SKIP_FIRST = 0.5
_SKIP_MAX = 5.0


class ControlError(Exception):
    """The control plane answered, but not with what was asked for."""


class _Target:
    """One control plane: its URL, its connection pool, and when to try it again after a failure."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.pool = Pool(loop, parts.hostname or "", parts.port or 80, max_idle=8)
        self.skip_until = 0.0
        """loop.time() before which calls try the others first."""
        self.skip = 0.0
        """How long the last failure put it aside; doubles with each failure in a row."""


class ControlClient:
    """HTTP calls from one gateway worker to `llmgw server`'s internal routes (one of several)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cp: ControlPlaneLink, creds: Credentials) -> None:
        self.loop = loop
        self.cp = cp
        self.targets = [_Target(loop, url) for url in cp.urls]
        self.active = 0
        """Index in `targets` of the control plane calls go to first."""
        self._auth = b"Authorization: Bearer " + creds.token.encode() + b"\r\n"
        self._lease_decoder = msgspec.json.Decoder(LeaseReply)
        self._snapshot_decoder = msgspec.json.Decoder(Snapshot)
        self._encoder = msgspec.json.Encoder()

    @property
    def url(self) -> str:
        """The URL of the control plane calls go to now (for the log)."""
        return self.targets[self.active].url

    def _order(self) -> list[int]:
        """Targets to try, the active one first, then the others in turn; those put aside
        after a failure go last (still tried: better a slow answer than none)."""
        n = len(self.targets)
        ring = [(self.active + k) % n for k in range(n)]
        now = self.loop.time()
        return ([i for i in ring if self.targets[i].skip_until <= now]
                + [i for i in ring if self.targets[i].skip_until > now])

    def _failed(self, i: int, why: object) -> None:
        t = self.targets[i]
        t.skip = min(t.skip * 2, _SKIP_MAX) if t.skip else _SKIP_FIRST
        t.skip_until = self.loop.time() + t.skip
        if i == self.active and len(self.targets) > 1:
            nxt = self._order()[0]
            if nxt != i:
                self.active = nxt
                log.warning("the control plane at %s failed (%s); moving to %s", t.url, why,
                            self.targets[nxt].url)

    def _worked(self, i: int) -> None:
        t = self.targets[i]
        t.skip = t.skip_until = 0.0
        if i != self.active:
            self.active = i

    async def call(self, method: bytes, path: bytes, body: bytes, timeout: float) -> tuple[int, bytes]:
        """One request, to the active control plane or, when it cannot be reached or answers
        503, to the next ones (each once); returns (status, body). Raises UpstreamError when
        no control plane could answer; a 503 is returned when all of them answered it."""
        deadline = self.loop.time() + timeout
        answer: tuple[int, bytes] | None = None
        error: UpstreamError | None = None
        for i in self._order():
            left = deadline - self.loop.time()
            if left <= 0:
                break
            try:
                status, data = await self._call_one(self.targets[i], method, path, body, left)
            except UpstreamError as e:
                self._failed(i, e)
                error = e
                continue
            if status == 503:
                self._failed(i, f"HTTP 503: {_message(data) or data[:200]!r}")
                answer = (status, data)
                continue
            self._worked(i)
            return status, data
        if answer is not None:
            return answer
        raise error if error is not None else UpstreamError("connect", "no time left to call a control plane")

    async def _call_one(self, target: _Target, method: bytes, path: bytes, body: bytes,
                        timeout: float) -> tuple[int, bytes]:
        """One request to one control plane; returns (status, body)."""
        pool = target.pool
        head = (method + b" " + path + b" HTTP/1.1\r\nHost: " + pool.hostport + b"\r\n" + self._auth
                + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        status, _, data = await fetch(pool, head, body, timeout, min(2.0, timeout))
        return status, data

    async def lease(self, req: LeaseRequest) -> LeaseReply:
        """POST /internal/v1/leases."""
        status, body = await self.call(b"POST", b"/internal/v1/leases", self._encoder.encode(req), LEASE_TIMEOUT)
        if status != 200:
            raise ControlError(f"lease call answered HTTP {status}: {body[:200]!r}")
        return self._lease_decoder.decode(body)

    async def post_usage(self, body: bytes) -> None:
        """POST /internal/v1/usage with one encoded UsageBatch."""
        status, answer = await self.call(b"POST", b"/internal/v1/usage", body, USAGE_TIMEOUT)
        if status in (400, 413, 422):
            raise BatchRejected(f"HTTP {status}: {answer[:300]!r}")
        if status not in (200, 204):
            raise ControlError(f"usage post answered HTTP {status}: {answer[:200]!r}")

    async def wake(self, model: str) -> None:
        """POST /internal/v1/wake; raises WakeRefused with the control plane's sentence when it
        will not start a replica, ControlError or UpstreamError when it could not be asked."""
        status, body = await self.call(b"POST", b"/internal/v1/wake", self._encoder.encode(WakeRequest(model=model)),
                                       WAKE_TIMEOUT)
        if status == 200:
            return
        if 400 <= status < 500 and status not in (401, 403, 408, 429):
            raise WakeRefused(_message(body) or f"the control plane answered HTTP {status}")
        raise ControlError(f"wake answered HTTP {status}: {body[:200]!r}")

    async def follow_snapshots(self, apply: Callable[[Snapshot], None]) -> None:
        """Long-polls GET /internal/v1/snapshot forever, calling `apply` with each new version."""
        after: int | None = None
        backoff = 0.05
        failures = 0
        while True:
            path = b"/internal/v1/snapshot" + (b"" if after is None else b"?after=%d" % after)
            try:
                status, body = await self.call(b"GET", path, b"", self.cp.snapshot_wait + 10.0)
                if status == 401 or status == 403:
                    raise ControlError(
                        f"the control plane refused this gateway's token (HTTP {status}); give the gateway "
                        "the data directory of `llmgw server` (--data-dir) or its LLMGW_GATEWAY_TOKEN")
                if status != 200:
                    raise ControlError(f"snapshot answered HTTP {status}: {body[:200]!r}")
                snap = self._snapshot_decoder.decode(body)
            except (UpstreamError, ControlError, msgspec.DecodeError) as e:
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.warning("cannot get the snapshot from the control plane at %s (%s); %d failures in a row",
                                self.url, e, failures)
                await asyncio.sleep(backoff)  # back-off between reconnects, not a poll
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            if failures:
                log.warning("snapshot from the control plane at %s again, version %d", self.url, snap.version)
            failures, backoff = 0, 0.05
            if snap.version != after:
                apply(snap)
                after = snap.version

    def close(self) -> None:
        """Closes idle connections."""
        for t in self.targets:
            t.pool.close()


class _ErrorBody(msgspec.Struct):
    message: str = ""


class _Error(msgspec.Struct):
    error: _ErrorBody


def _message(body: bytes) -> str:
    """The sentence of an error answer of the admin API (OpenAI shape), or ''."""
    try:
        return msgspec.json.decode(body, type=_Error).error.message[:500]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""
