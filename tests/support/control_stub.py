"""A stand-in for `llmgw server` in the gateway's tests: the internal routes, nothing else.

A plain asyncio HTTP/1.1 server on its own thread and loop, serving
`llmgw.admin.internal.ROUTES` with the real `SnapshotPublisher` and
`LimitsAuthority`, a hand-built snapshot (keys, projects, and the catalog's models
and placed replicas), a list of the usage batches it took and of the wakes asked for.
Tests change the snapshot with `publish()`, wait for a gateway to hold a version with
`wait_applied()`, and wait for batches and wakes with `wait_usage()` and `wait_wakes()`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import msgspec

from llmgw.admin.internal import ROUTES
from llmgw.admin.route import ApiError, Raw, Request
from llmgw.control.limits import LimitsAuthority
from llmgw.control.snapshots import SnapshotPublisher
from llmgw.protocol.wire import (
    KeyEntry,
    LeaseReply,
    LeaseRequest,
    Limits,
    ModelEntry,
    ReplicaEntry,
    Snapshot,
    UsageBatch,
    WakeReply,
)
from llmgw.secrets.keys import GATEWAY_TOKEN_LABEL, HASH_LABEL, derive, key_hash

T = TypeVar("T")


def new_key() -> str:
    """An API key of the issued shape."""
    return "sk-llmgw-" + secrets.token_urlsafe(30)[:40]


class State:
    """What the handlers reach through `req.state`."""

    def __init__(self, used_tokens: Callable[[str, float], Coroutine[Any, Any, int]] | None) -> None:
        self.snapshots = SnapshotPublisher()
        self.limits = LimitsAuthority(used_tokens)
        self.batches: list[UsageBatch] = []
        self.cond = threading.Condition()
        self.refuse_usage = False
        lease = self.limits.lease

        async def lease_and_tell(req: LeaseRequest) -> LeaseReply:
            reply = await lease(req)
            with self.cond:
                self.cond.notify_all()
            return reply

        self.limits.lease = lease_and_tell  # type: ignore[method-assign]
        self.first_polls = 0
        """Snapshot long-polls answered to a worker that had none yet (after= absent)."""
        self.held: list[int] = []
        """Versions gateways said they hold (`after=`), in the order their polls came: a worker
        polls with after=V only once it applied version V."""
        self.wakes: list[str] = []
        """Models gateways asked to wake, in order."""
        self.on_wake: Callable[[str], None] | None = None
        """Called (on the stub's loop) with each wake's model; may raise ApiError to refuse it."""
        wait = self.snapshots.wait

        async def wait_and_count(after: int | None, timeout: float = 20.0) -> bytes | None:
            if after is not None:
                with self.cond:
                    self.held.append(after)
                    self.cond.notify_all()
            body = await wait(after, timeout)
            if after is None and body is not None:
                with self.cond:
                    self.first_polls += 1
                    self.cond.notify_all()
            return body

        self.snapshots.wait = wait_and_count  # type: ignore[method-assign]

    async def wake(self, model: str) -> WakeReply:
        with self.cond:
            self.wakes.append(model)
            self.cond.notify_all()
        if self.on_wake is not None:
            self.on_wake(model)
        return WakeReply(model=model)

    async def take_usage(self, batch: UsageBatch) -> None:
        """Keeps a usage batch as the gateway sent it (the real route hands the store a
        `Post` made from it, which has no trace of rows against objects)."""
        if self.refuse_usage:
            raise ApiError(503, "usage.down", "refusing usage for a test")
        with self.cond:
            self.batches.append(batch)
            self.cond.notify_all()


class ControlStub:
    """The stand-in server; `url`, `data_dir`, and helpers to make keys and snapshots."""

    def __init__(self, data_dir: Path,
                 used_tokens: Callable[[str, float], Coroutine[Any, Any, int]] | None = None) -> None:
        self.data_dir = data_dir
        self.secret = os.urandom(32)
        (data_dir / "secret").write_text(self.secret.hex() + "\n")  # as `llmgw server` writes it
        (data_dir / "secret").chmod(0o600)
        self.token = derive(self.secret, GATEWAY_TOKEN_LABEL).hex()
        self.hash_key = derive(self.secret, HASH_LABEL)
        self.state = State(used_tokens)
        self.keys: list[KeyEntry] = []
        self.plaintext: dict[str, str] = {}
        self.projects: dict[str, Limits] = {}
        self.models: list[ModelEntry] = []
        self.replicas: list[ReplicaEntry] = []
        self.version = 0
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop: asyncio.Future[None]
        self.port = 0
        self._routes = {(r.method, r.path): r for r in ROUTES}

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> ControlStub:
        self._thread.start()
        self._started.wait(10)
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._stop = self.loop.create_future()

        async def main() -> None:
            server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._started.set()
            async with server:
                await self._stop
            server.close()

        self.loop.run_until_complete(main())
        # Connection handlers still running (gateways keep connections open): end them.
        rest = asyncio.all_tasks(self.loop)
        for t in rest:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set_result, None)
            self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs a coroutine on the stub's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    # -- test helpers -----------------------------------------------------------------
    def add_key(self, *, project: str = "proj_a", limits: Limits | None = None, expires_at: float | None = None,
                keep_bodies: bool = False, user: str | None = "user_a", publish: bool = True) -> tuple[str, KeyEntry]:
        key = new_key()
        entry = KeyEntry(key_id="key_" + secrets.token_hex(8), hash=key_hash(self.hash_key, key), org_id="org_a",
                         team_id="team_a", project_id=project, user_id=user, expires_at=expires_at,
                         limits=limits or Limits(), keep_bodies=keep_bodies)
        self.keys.append(entry)
        self.plaintext[entry.key_id] = key
        if publish:
            self.publish()
        return key, entry

    def revoke(self, key_id: str) -> None:
        self.keys = [k for k in self.keys if k.key_id != key_id]
        self.publish()

    def publish(self, *, models: list[ModelEntry] | None = None, replicas: list[ReplicaEntry] | None = None) -> int:
        """Publishes the next version (with new models or replicas when given); returns it."""
        if models is not None:
            self.models = models
        if replicas is not None:
            self.replicas = replicas
        self.version += 1
        snap = Snapshot(version=self.version, keys=list(self.keys), projects=dict(self.projects),
                        models=list(self.models), replicas=list(self.replicas))

        async def build() -> Snapshot:
            return snap

        self.run(self.state.snapshots.refresh(build))
        return snap.version

    def wait_applied(self, version: int, workers: int = 1, timeout: float = 10.0) -> None:
        """Waits until `workers` long-polls said they hold `version` (or a later one)."""
        self._wait(lambda st: sum(v >= version for v in st.held) >= workers,
                   f"no gateway worker applied snapshot version {version}", timeout)

    def wait_wakes(self, n: int, timeout: float = 10.0) -> list[str]:
        """Waits until n wakes were asked for; returns their models."""
        self._wait(lambda st: len(st.wakes) >= n, f"fewer than {n} wakes came", timeout)
        return list(self.state.wakes)

    def _wait(self, pred: Callable[[State], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while not pred(self.state):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(what)
                self.state.cond.wait(left)

    def wait_usage(self, pred: Callable[[list[UsageBatch]], bool], timeout: float = 10.0) -> list[UsageBatch]:
        """Waits until `pred(batches)` holds; returns the batches."""
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while not pred(self.state.batches):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"usage never matched; {len(self.state.batches)} batches")
                self.state.cond.wait(left)
            return list(self.state.batches)

    def wait_first_polls(self, n: int, timeout: float = 20.0) -> None:
        """Waits until n workers got their first snapshot."""
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while self.state.first_polls < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"only {self.state.first_polls} of {n} workers got a snapshot")
                self.state.cond.wait(left)

    def wait_limits(self, pred: Callable[[LimitsAuthority], bool], timeout: float = 10.0) -> None:
        """Waits (woken by each lease call) until `pred(authority)` holds."""
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while not pred(self.state.limits):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("the limits authority never reached the expected state")
                self.state.cond.wait(min(left, 0.5))

    # -- HTTP -------------------------------------------------------------------------
    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, ctype, out = await self._handle(method, target, headers, body)
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(out)}\r\n\r\n"
                             .encode() + out)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The stub stops: end quietly (asyncio's server logs a handler that ends cancelled).
            pass
        finally:
            writer.close()

    async def _handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, "application/json", b'{"error":{"message":"bad gateway token"}}'
        path, _, qs = target.partition("?")
        route = self._routes.get((method, path))
        if route is None:
            return 404, "application/json", b"{}"
        decoded = msgspec.json.decode(body, type=route.request) if route.request is not None else None
        req = Request(method=method, path=path, path_params={}, query=dict(parse_qsl(qs)), body=decoded,
                      actor="gateway", db=None, state=self.state, headers=headers)  # type: ignore[arg-type]
        try:
            if isinstance(decoded, UsageBatch):
                await self.state.take_usage(decoded)
                return route.status, "application/json", b""
            result = await route.handler(req)
        except ApiError as e:
            return e.status, "application/json", msgspec.json.encode({"error": {"message": e.message, "code": e.code}})
        if isinstance(result, Raw):
            return result.status, result.content_type, result.body
        if result is None:
            return route.status, "application/json", b""
        return route.status, "application/json", msgspec.json.encode(result)
