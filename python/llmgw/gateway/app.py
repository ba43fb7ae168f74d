"""The RSGI application of `llmgw gateway`: the OpenAI routes, health, readiness and metrics.

Granian imports this module in each worker (after it made the worker's uvloop)
and calls `create_app()`; `__rsgi_init__` then builds the worker's state on that
loop. Nothing here runs in granian's parent process, so nothing is forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from granian._granian import RSGIProtocolClosed as ProtocolClosed

from llmgw import _core
from llmgw.config import CONFIG_ENV, GatewayConfig, decode_gateway
from llmgw.net.deadlines import Deadlines
from llmgw.net.serving import read_body, settle_worker_heap
from llmgw.net.silent import SilentSweep
from llmgw.protocol.wire import Limits, Snapshot

from . import body as reqbody
from . import routing
from .auth import SCHEME, KeyTable, Unauthorized
from .control import ControlClient
from .credentials import Credentials, load_credentials
from .errors import Kind, error_body, truncate
from .fleet import Catalog
from .kv_events import KvSubscriber
from .limits import FREE, Denied, Limiter, Ticket, Unavailable
from .metrics import Metrics
from .proxy import Call, Proxy
from .replicas import ReplicaSet
from .retry_budget import RetryBank
from .usage import UsageSink
from .wake import Waker

log = logging.getLogger("llmgw.gateway")

JSON = "application/json"

# Client headers that are never passed to a replica: hop-by-hop headers, the
# client's own credentials, and anything that would let a client steer where the
# gateway connects.
_NOT_FORWARDED = frozenset({
    "host", "content-length", "content-type", "connection", "keep-alive", "transfer-encoding",
    "te", "trailer", "upgrade", "authorization", "proxy-authorization", "cookie", "x-request-id",
    "x-forwarded-host", "x-api-base", "x-base-url",
})

# A request's token estimate for tpm and budgets when it sets no max_tokens: what it
# really used is settled when it ends, so this only decides how much is held meanwhile.
DEFAULT_COMPLETION_ESTIMATE = 256

_REFUSED: Final = object()
"""What `_principal` returns when it has already answered 401 or 503."""


class Gateway:
    """One worker's gateway; the RSGI entry point is `__rsgi__`."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.catalog = Catalog((m for e in cfg.endpoints for m in e.models), cfg.aliases)
        # Per-worker random prefix + counter: unique across workers and restarts,
        # and far cheaper than a uuid4 per request.
        self._rid_prefix = os.urandom(6).hex()
        self._rid_next = 0
        self.replicas: ReplicaSet | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deadlines: Deadlines | None = None
        self.proxy: Proxy | None = None
        self.metrics: Metrics | None = None
        cp = cfg.control_plane
        # Random per worker start: the control plane settles the open requests of a
        # gateway id it stops hearing from, and a restarted worker is a new one.
        self.gateway_id = "gw_" + os.urandom(8).hex()
        self.creds: Credentials | None = None
        self.keys: KeyTable | None = None
        self.limiter: Limiter | None = None
        self.control: ControlClient | None = None
        self.waker: Waker | None = None
        self.silent: SilentSweep | None = None
        self._tasks: list[asyncio.Task[None]] = []
        if cp is not None:
            self.creds = load_credentials(cp)
            self.keys = KeyTable(self.creds.hash_key, replay_token=self.creds.token)
        self.usage = UsageSink(cfg.usage_log, interval=0.5 if cp is None else cp.usage_interval,
                               gateway_id=self.gateway_id,
                               max_pending=200_000 if cp is None else cp.usage_max_pending)
        self.kv_index: _core.KvIndex | None = None
        self.kv_events: KvSubscriber | None = None
        self.routes: dict[tuple[str, str], Callable[[Any, Any, str], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._inference,
            ("POST", "/v1/completions"): self._inference,
            ("POST", "/v1/embeddings"): self._inference,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/ready"): self._ready,
            ("GET", "/metrics"): self._metrics,
        }
        self._paths = {path for _, path in self.routes}

    # -- RSGI hooks ---------------------------------------------------------------
    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # One loop timer for every deadline of the worker's requests (the body's, the
        # disconnect watch's, the replica's first byte): a timer each cost ~10 µs a request.
        self.deadlines = Deadlines(loop)
        self.replicas = ReplicaSet(loop, self.cfg.endpoints, self.cfg.health, deadlines=self.deadlines)
        self.replicas.scrape_load = routing.configure(self.replicas.router, self.cfg.routing)
        precise = routing.precise_models(self.cfg.routing)
        if precise:
            self.kv_index = _core.KvIndex(block_size=self.cfg.kv_block_size)
            for model in precise:
                self.replicas.router.set_kv_index(model, self.kv_index)
            self.kv_events = KvSubscriber(loop, self.kv_index, self.cfg.endpoints)
            self.kv_events.start()
        self.metrics = Metrics(self._replica_snapshot, self.replicas.router.decisions)
        self.metrics.kv_stats = None if self.kv_index is None else self.kv_index.stats
        self.usage.watch = self.metrics
        metrics = self.metrics
        self.silent = SilentSweep.serving(self.cfg.host, self.cfg.port, self.cfg.timeouts.client_headers,
                                          lambda n: metrics.connections_closed("silent", n))
        self.replicas._on_ejection = self.metrics.ejection
        self.replicas.on_spared = self.metrics.ejection_spared
        t = self.cfg.timeouts
        self.proxy = Proxy(
            self.replicas, self.usage, self.metrics, retries=self.cfg.retries,
            connect=t.connect, first_byte=t.first_byte, idle=t.idle, total=t.total, client_idle=t.client_idle,
            max_response_bytes=self.cfg.max_response_bytes, retry_after=self.cfg.retry_after_seconds,
            budget=RetryBank(self.cfg.retry_budget.ratio, self.cfg.retry_budget.min_per_second),
        )
        self.replicas.start_probes()
        cp = self.cfg.control_plane
        if cp is not None and self.creds is not None and self.keys is not None:
            self.control = ControlClient(loop, cp, self.creds)
            self.waker = Waker(loop, self.control.wake, self.replicas.router.has_model)
            self.usage.ship = self.control.post_usage
            self.limiter = Limiter(self.gateway_id, self.control.lease, wait=cp.lease_wait,
                                   idle_return=cp.lease_idle_return)
            self.limiter.on_tick = self.usage.follow(self.limiter.interval)
            self._tasks = [loop.create_task(self.control.follow_snapshots(self._apply_snapshot)),
                           loop.create_task(self.limiter.run())]
        self.usage.start(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        for t in self._tasks:
            t.cancel()
        if self.silent is not None:
            self.silent.stop()
        if self.waker is not None:
            self.waker.close()
        if self.limiter is not None:
            # Slots and unused units go back now rather than when the authority reclaims them.
            loop.run_until_complete(self.limiter.close())
        if self.kv_events is not None:
            loop.run_until_complete(self.kv_events.close())
        if self.replicas is not None:
            loop.run_until_complete(self.replicas.close())
        loop.run_until_complete(self.usage.close())
        if self.control is not None:
            self.control.close()
        if self.deadlines is not None:
            self.deadlines.close()
        if self.proxy is not None:
            self.proxy.tcp.close()
        if self.metrics is not None:
            self.metrics.close()

    def _apply_snapshot(self, snap: Snapshot) -> None:
        """Takes a new snapshot: keys and limits, the replicas placed, the catalog's models."""
        assert self.keys is not None and self.replicas is not None
        self.keys.load(snap)
        added, removed = self.replicas.update(snap.replicas)
        if self.kv_events is not None:
            for r in removed:
                self.kv_events.remove(r.id)
            for r in added:
                self.kv_events.add(r.endpoint)
        self.catalog.load(snap.models, (r.model for r in snap.replicas))
        if self.waker is not None:
            self.waker.settle(lambda m: self.catalog.wakeable(m) is not None)

    def _replica_snapshot(self) -> list[tuple[str, int, bool]]:
        assert self.replicas is not None
        router = self.replicas.router
        return [(r.id, router.outstanding(r.index), router.is_healthy(r.index)) for r in self.replicas.replicas]

    # -- dispatch -----------------------------------------------------------------
    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        # Always this worker's own id, never the client's x-request-id: the id keys the
        # request's usage record, which the control plane counts once per id (a record sent
        # twice is one request), so a client that sent one id on every request would have
        # them all counted as one.
        self._rid_next += 1
        rid = f"{self._rid_prefix}{self._rid_next:08x}"
        path = scope.path
        handler = self.routes.get((scope.method, path))
        if handler is not None:
            await handler(scope, protocol, rid)
        elif scope.method == "GET" and path.startswith("/v1/models/"):
            if self._principal(scope, protocol, rid) is not _REFUSED:
                self._model(protocol, rid, path[len("/v1/models/"):])
        elif path in self._paths:
            self._error(protocol, rid, Kind.METHOD_NOT_ALLOWED, f"{scope.method} is not allowed on {path}")
        else:
            self._error(protocol, rid, Kind.NOT_FOUND,
                        f"no route {scope.method} {truncate(path)}; the OpenAI API is served under /v1")

    def _error(self, protocol: Any, rid: str, kind: Kind, message: str, param: str | None = None) -> None:
        protocol.response_bytes(kind.status, [("content-type", JSON), ("x-request-id", rid)],
                                error_body(kind, message, param))

    # -- OpenAI routes ------------------------------------------------------------
    def _principal(self, scope: Any, protocol: Any, rid: str) -> Any:
        """The request's key entry; None without a control plane; `_REFUSED` once answered."""
        keys = self.keys
        if keys is None:
            return None
        if keys.version is None:
            self._error(protocol, rid, Kind.NOT_READY,
                        "the gateway has not received its keys from the control plane yet; retry in a moment")
            return _REFUSED
        try:
            headers = scope.headers
            return keys.resolve(headers.get("authorization"), scope.query_string,
                                replay_key=headers.get("x-llmgw-replay-key"))
        except Unauthorized as e:
            self._error(protocol, rid, Kind.UNAUTHORIZED, str(e))
            return _REFUSED

    async def _inference(self, scope: Any, protocol: Any, rid: str) -> None:
        keys = self.keys
        # A valid key sent as nearly every client sends it, in one native call (the keyed
        # hash, the lookup, the expiry); anything else goes through `_principal`, which
        # answers 401 or 503 with the reason.
        entry = None if keys is None or keys.version is None or scope.query_string else \
            keys.keys.get_live(scope.headers.get("authorization") or "", SCHEME)
        if entry is None:
            entry = self._principal(scope, protocol, rid)
            if entry is _REFUSED:
                return None
        limit = self.cfg.max_body_bytes
        declared = scope.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return self._error(protocol, rid, Kind.BODY_TOO_LARGE,
                               f"request body is {declared} bytes; this gateway accepts at most {limit}")
        # With a declared length the body comes in one call; without one (chunked
        # upload) it is read piece by piece and reading stops at the limit. Bounded by a
        # deadline on the worker's wheel (`asyncio.timeout` cost 4 µs a request).
        task = asyncio.current_task()
        deadlines, loop = self.deadlines, self.loop
        assert task is not None and deadlines is not None and loop is not None
        slot = deadlines.cancel_at(loop.time() + self.cfg.timeouts.client_body, task)
        try:
            data = await protocol() if declared is not None else await read_body(protocol, limit)
        except asyncio.CancelledError:
            if not deadlines.expired(task):
                raise
            return self._error(protocol, rid, Kind.BODY_TIMEOUT,
                               f"the request body did not arrive within {self.cfg.timeouts.client_body:g} s; "
                               "send it at once after the headers")
        finally:
            deadlines.remove(slot, task)
        if data is None or len(data) > limit:
            return self._error(protocol, rid, Kind.BODY_TOO_LARGE,
                               f"request body is over {limit} bytes; this gateway accepts at most {limit}")
        try:
            head = reqbody.DECODER.decode(data)
        except msgspec.ValidationError as e:
            return self._error(protocol, rid, Kind.INVALID_REQUEST, f"invalid request: {e}",
                               reqbody.param_of(e))
        except msgspec.DecodeError as e:
            return self._error(protocol, rid, Kind.INVALID_JSON,
                               f"request body is not valid JSON: {e}; send a JSON object")
        except RecursionError:
            # msgspec stops at the interpreter's recursion limit; a client must not
            # be able to turn that into a 500 (or worse) with a few kilobytes of [[[.
            return self._error(protocol, rid, Kind.INVALID_JSON,
                               "request body nests arrays or objects too deeply to read; flatten it")
        original = data
        model = head.model
        target = self.catalog.target(model)
        assert self.proxy is not None and self.replicas is not None
        wake = None
        if not self.replicas.router.has_model(target):
            if target not in self.catalog.models:
                return self._error(protocol, rid, Kind.MODEL_NOT_FOUND,
                                   f"model {truncate(model)!r} does not exist here; GET /v1/models lists the "
                                   "models served", "model")
            wake = self.catalog.wakeable(target)
            if wake is None or self.waker is None:
                return self._unplaced(protocol, rid, model, f"model {truncate(model)!r} has no ready replica and "
                                      "does not scale from zero; an operator can scale it up "
                                      f"(`llmgw ctl models scale {truncate(target)} 1`)")
        path = scope.path  # read once: each read of a scope attribute is a call into granian
        embeddings = path == "/v1/embeddings"
        stream = bool(head.stream) and not embeddings
        wants_usage = head.stream_options is not None and bool(head.stream_options.include_usage)
        strip_usage = stream and not wants_usage
        if target != model or strip_usage:
            data = _core.patch_request(data, target if target != model else None, strip_usage)
        keep = None
        if entry is not None and entry.keep_bodies and not head.no_store \
                and scope.headers.get("x-llmgw-no-store", "").lower() not in ("1", "true"):
            keep = original
        ticket = FREE
        limiter = self.limiter
        if limiter is not None and entry is not None:
            completion = 0 if embeddings else (
                head.max_completion_tokens or head.max_tokens or DEFAULT_COMPLETION_ESTIMATE)
            cost = len(data) // 4 + completion
            assert keys is not None  # an entry comes from the keys
            project = keys.projects.get(entry.project_id)
            # From what the worker holds, without a coroutine: one native call for a key
            # seen before (`Limiter.take` without its frame), else (False) the limiter's
            # `take` works the key's shares out once. None: what is held does not admit it,
            # and `_admit` waits for a lease or answers the refusal (it takes once more).
            got = _core.take(limiter.memo, entry, project, limiter.clock(), cost)
            if got is False:
                try:
                    got = limiter.take(entry, project, cost)
                except Denied:
                    got = None
            if got is None:
                got = await self._admit(protocol, rid, entry, project, model, cost)
                if got is None:
                    return None
            ticket = got
        call = Call(rid, model, target, stream, entry, keep)
        if stream:
            call.scope = scope  # its addresses, read only if the answer grows long (slow readers)
        try:
            if wake is not None and not await self._wake(protocol, rid, model, target, wake.scale_up_timeout):
                return None
            await self.proxy.forward(protocol, call, path.encode(), data,
                                     _forwarded(scope.headers), strip_usage)
        finally:
            # Whatever way the request ended (answer, error, disconnect, cancellation).
            ticket.release(call.prompt + call.completion)

    async def _wake(self, protocol: Any, rid: str, model: str, target: str, timeout: float) -> bool:
        """Holds the request until a replica of `target` is routable; False once answered (503 or gone)."""
        assert self.waker is not None and self.metrics is not None
        t0 = time.perf_counter()
        # Watched from the start: a client that leaves during a minute-long wait
        # must not have its request forwarded when the replica comes.
        gone = asyncio.ensure_future(protocol.client_disconnect())
        try:
            outcome, reason = await self.waker.wait(target, timeout, gone)
        finally:
            gone.cancel()
        self.metrics.woken(model, outcome)
        if outcome == "ready":
            return True
        waited = time.perf_counter() - t0
        if outcome == "gone":
            self.metrics.request(model, "cancelled", waited, None, 0, 0)
            # Answered anyway: RSGI expects a response to every request.
            with contextlib.suppress(ProtocolClosed):
                self._error(protocol, rid, Kind.UPSTREAM_FAILED, "client disconnected")
            return False
        self.metrics.request(model, "no_replica", waited, None, 0, 0)
        if outcome == "refused":
            self._unplaced(protocol, rid, model, f"model {truncate(model)!r} has no ready replica and the control "
                           f"plane cannot start one: {reason}")
            return False
        retry = self.cfg.retry_after_seconds
        protocol.response_bytes(Kind.SCALING_UP.status, [("content-type", JSON), ("x-request-id", rid),
                                                         ("retry-after", str(retry))],
                                error_body(Kind.SCALING_UP, f"model {truncate(model)!r} had no ready replica; one is "
                                           f"being started but was not ready within {timeout:g}s; retry after "
                                           f"{retry}s"))
        return False

    def _unplaced(self, protocol: Any, rid: str, model: str, message: str) -> None:
        retry = self.cfg.retry_after_seconds
        protocol.response_bytes(Kind.NOT_PLACED.status, [("content-type", JSON), ("x-request-id", rid),
                                                         ("retry-after", str(retry))],
                                error_body(Kind.NOT_PLACED, message, "model"))

    async def _admit(self, protocol: Any, rid: str, entry: Any, project: Limits | None, model: str,
                     cost: int) -> Ticket | None:
        """A ticket from the limits once a lease came (`acquire` takes first), or None once
        answered 429/503."""
        assert self.limiter is not None
        try:
            return await self.limiter.acquire(entry, project, cost)
        except Denied as d:
            kind = Kind.TOKENS_LIMITED if d.limit in ("tpm", "budget") else Kind.RATE_LIMITED
            retry = max(1, math.ceil(d.retry_after))
            assert self.metrics is not None
            self.metrics.request(model, "rate_limited", 0.0, None, 0, 0)
            protocol.response_bytes(kind.status, [("content-type", JSON), ("x-request-id", rid),
                                                  ("retry-after", str(retry))],
                                    error_body(kind, f"{d}; retry after {retry}s"))
            return None
        except Unavailable as u:
            cp = self.cfg.control_plane
            if cp is not None and cp.limits_fail_open:
                return FREE
            self._error(protocol, rid, Kind.LIMITS_UNAVAILABLE,
                        f"limits cannot be checked ({u}); the request was not forwarded, retry shortly")
            return None

    async def _models(self, scope: Any, protocol: Any, rid: str) -> None:
        if self._principal(scope, protocol, rid) is _REFUSED:
            return
        protocol.response_bytes(200, [("content-type", JSON), ("x-request-id", rid)], self.catalog.body)

    def _model(self, protocol: Any, rid: str, name: str) -> None:
        obj = self.catalog.objects.get(name)
        if obj is None:
            return self._error(protocol, rid, Kind.MODEL_NOT_FOUND,
                               f"model {truncate(name)!r} does not exist here; GET /v1/models lists the models served",
                               "model")
        protocol.response_bytes(200, [("content-type", JSON), ("x-request-id", rid)], msgspec.json.encode(obj))

    # -- operations ---------------------------------------------------------------
    async def _health(self, scope: Any, protocol: Any, rid: str) -> None:
        protocol.response_bytes(200, [("content-type", JSON), ("x-request-id", rid)], b'{"status":"ok"}')

    async def _ready(self, scope: Any, protocol: Any, rid: str) -> None:
        assert self.replicas is not None
        if self.keys is not None and self.keys.version is None:
            body = error_body(Kind.NOT_READY, "no snapshot of keys from the control plane yet; "
                              "the gateway cannot authenticate requests")
            protocol.response_bytes(503, [("content-type", JSON), ("x-request-id", rid),
                                          ("retry-after", "1")], body)
            return
        n = self.replicas.router.healthy_count()
        # A gateway whose models all sleep is still ready: a request wakes one.
        if n or (self.waker is not None and any(m.scale_from_zero for m in self.catalog.models.values())):
            body = msgspec.json.encode({"status": "ready", "healthy_replicas": n})
            protocol.response_bytes(200, [("content-type", JSON), ("x-request-id", rid)], body)
            return
        body = error_body(Kind.NO_REPLICA, "no replica is healthy; the gateway cannot serve requests yet")
        protocol.response_bytes(503, [("content-type", JSON), ("x-request-id", rid),
                                      ("retry-after", str(self.cfg.retry_after_seconds))], body)

    async def _metrics(self, scope: Any, protocol: Any, rid: str) -> None:
        assert self.metrics is not None
        protocol.response_bytes(200, [("content-type", "text/plain; version=0.0.4; charset=utf-8"),
                                      ("x-request-id", rid)], self.metrics.render())


def _forwarded(headers: Any) -> bytes:
    """The client's `x-*` headers that travel to the replica (trace ids, test hooks, tags), less
    `_NOT_FORWARDED` (x-request-id among them: the replica gets the gateway's own)."""
    out = b""
    for k, v in headers.items():
        if k.startswith("x-") and k not in _NOT_FORWARDED and not k.startswith("x-llmgw-"):
            out += f"{k}: {v}\r\n".encode("latin-1", "replace")
    return out


def create_app() -> Gateway:
    """Granian's factory: builds the worker's app from the configuration in the environment."""
    raw = os.environ.get(CONFIG_ENV)
    cfg = decode_gateway(raw) if raw else GatewayConfig()
    settle_worker_heap()
    return Gateway(cfg)
