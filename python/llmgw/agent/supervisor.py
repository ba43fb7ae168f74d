"""The engine supervisor: runs each replica's engine, probes it, restarts it with back-off,
parks it when it keeps failing.

Each replica is one asyncio task that owns its process from start to stop, so
that "is it running" has one answer. Every state change is told to `on_status`
at once (the agent forwards it to the control plane); `statuses()` gives them
all, for heartbeats and re-registration.

Time is read only from the injected clock: the tests drive back-off, probe
intervals and drain deadlines without waiting for them.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from llmgw.agent.clock import Clock, RealClock, race
from llmgw.agent.process import EngineProcess, Spawn, describe_exit, spawn
from llmgw.engines.launch import KV_EVENTS, Launch, LaunchRequest, UnknownEngineError, build_launch
from llmgw.engines.probe import http_probe

State = Literal["pending", "starting", "ready", "draining", "stopped", "parked"]
Probe = Callable[[Launch], Awaitable[bool]]
MARK = "[llmgw-agent]"  # prefixes the agent's own lines among an engine's log lines


class SupervisorSettings(msgspec.Struct, kw_only=True):
    """How engines are run; the control plane's Settings override the policy fields."""

    port_range: tuple[int, int] = (20000, 20999)
    engine_host: str = "0.0.0.0"
    max_failures: int = 5
    """Failures within `failure_window_s` that park a replica."""
    failure_window_s: float = 600.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    probe_interval_s: float = 0.5
    start_timeout_s: float = 1800.0
    """Loading large weights takes long; an engine not ready by then counts as a failure."""
    log_lines: int = 500


class ReplicaInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent reports about one replica."""

    replica_id: str
    model: str
    engine: str
    state: State
    port: int = 0
    pid: int = 0
    restarts: int = 0
    reason: str = ""
    gpu_uuids: tuple[str, ...] = ()
    kv_events_port: int = 0
    kv_replay_port: int = 0


class NoFreePortError(RuntimeError):
    """Every port of the range is taken."""


class _Replica:
    def __init__(self, req: LaunchRequest, log_lines: int) -> None:
        self.req = req
        self.state: State = "pending"
        self.reason = ""
        self.pid = 0
        self.restarts = 0
        self.failures: deque[float] = deque()
        self.logs: deque[str] = deque(maxlen=log_lines)
        self.proc: EngineProcess | None = None
        self.stopping = False
        self.task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        """Running or on its way: it holds its ports and is reported."""
        return self.state not in ("stopped", "parked")

    def info(self) -> ReplicaInfo:
        r = self.req
        up = self.live
        return ReplicaInfo(
            replica_id=r.replica_id, model=r.model, engine=r.engine, state=self.state,
            port=r.port if up else 0, pid=self.pid, restarts=self.restarts, reason=self.reason,
            gpu_uuids=r.gpu_uuids, kv_events_port=r.kv_events_port if up else 0,
            kv_replay_port=r.kv_replay_port if up else 0,
        )  # fmt: skip


class Supervisor:
    """Starts, watches and stops the engine processes of this node."""

    def __init__(
        self,
        settings: SupervisorSettings,
        on_status: Callable[[ReplicaInfo], None] = lambda info: None,
        *,
        clock: Clock | None = None,
        spawn: Spawn = spawn,
        probe: Probe = http_probe,
        port_free: Callable[[str, int], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.on_status = on_status
        self.clock: Clock = clock or RealClock()
        self._spawn = spawn
        self._probe = probe
        self._port_free = port_free or _bindable
        self._replicas: dict[str, _Replica] = {}
        self._closing = False

    # ---- commands ---------------------------------------------------------------------

    def start(self, req: LaunchRequest) -> ReplicaInfo:
        """Run `req` (port 0: one from the range). Idempotent: a replica already running is left as it is.

        A parked or stopped replica with the same id starts afresh (failures forgotten).
        A start that cannot run (after `close()`, or with no free port) parks the replica
        with the reason, told to `on_status` like every other change, so the control
        plane reads it in the replica's status and places it elsewhere.
        """
        old = self._replicas.get(req.replica_id)
        if old is not None and old.live:
            return old.info()
        if self._closing:  # kept nowhere: close() drained this node and nothing starts after
            return self._refuse(req, "the agent is shutting down", keep=False)
        try:
            req = self._with_ports(req)
        except NoFreePortError as exc:
            return self._refuse(req, str(exc), keep=True)
        if not req.host:
            req = msgspec.structs.replace(req, host=self.settings.engine_host)
        r = _Replica(req, self.settings.log_lines)
        self._replicas[req.replica_id] = r
        self._emit(r)
        r.task = asyncio.create_task(self._run(r), name=f"replica {req.replica_id}")
        return r.info()

    async def stop(self, replica_id: str, drain_s: float) -> None:
        """Drain (SIGTERM, `drain_s` to finish in-flight work), then SIGKILL; the replica ends stopped."""
        r = self._replicas.get(replica_id)
        if r is None or r.state == "stopped":
            return
        r.stopping = True
        task = r.task
        if r.proc is not None:
            self._set(r, "draining", f"stopping: draining for up to {drain_s:g}s")
            r.proc.signal(signal.SIGTERM)
            if task is not None and not await race(self.clock, task, drain_s) and r.proc is not None:
                r.logs.append(f"{MARK} still running {drain_s:g}s after SIGTERM: SIGKILL")
                r.proc.signal(signal.SIGKILL)
        elif task is not None:
            task.cancel()  # waiting out a back-off, or parked: nothing runs
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        self._set(r, "stopped", "stopped on request")
        r.pid = 0
        del self._replicas[replica_id]

    async def drain(self, drain_s: float) -> None:
        """Stop every replica, all at once, each within `drain_s`."""
        await asyncio.gather(*(self.stop(rid, drain_s) for rid in list(self._replicas)))

    async def close(self, drain_s: float) -> None:
        """Drain every replica and start none after: the agent is going away.

        Without this, the control plane, which still holds the stream while the
        engines drain, sees a replica stop and places another one on this node,
        and the agent would start it and exit, leaving it running (engines are in
        their own sessions, so nothing else stops them).
        """
        self._closing = True
        await self.drain(drain_s)

    def update_policy(self, **fields: float) -> None:
        """Change restart and park settings (from the control plane's Settings); zero keeps a value."""
        changes = {k: v for k, v in fields.items() if v}
        if changes:
            self.settings = msgspec.structs.replace(self.settings, **changes)

    # ---- reads ------------------------------------------------------------------------

    def statuses(self) -> list[ReplicaInfo]:
        """Every replica this agent knows, in start order."""
        return [r.info() for r in self._replicas.values()]

    def logs(self, replica_id: str, lines: int = 0) -> list[str] | None:
        """The last `lines` output lines of a replica's engine (0: all kept); None if unknown."""
        r = self._replicas.get(replica_id)
        if r is None:
            return None
        kept = list(r.logs)
        return kept[-lines:] if lines else kept

    # ---- the per-replica task ---------------------------------------------------------

    async def _run(self, r: _Replica) -> None:
        try:
            launch = build_launch(r.req)
        except UnknownEngineError as exc:
            self._set(r, "parked", f"cannot start: {exc}")
            return
        while not r.stopping:
            why = await self._run_once(r, launch)
            if r.stopping:
                return
            now = self.clock.monotonic()
            r.failures.append(now)
            window = self.settings.failure_window_s
            while r.failures and r.failures[0] < now - window:
                r.failures.popleft()
            n = len(r.failures)
            if n >= self.settings.max_failures:
                last = next((ln for ln in reversed(r.logs) if not ln.startswith(MARK)), "")
                tail = f"; its last output line: {last[:200]!r}" if last else ""
                self._set(r, "parked", f"the engine failed {n} times within {window:g}s, so it is "
                          f"parked and not restarted; the last time it {why}{tail}")  # fmt: skip
                return
            # Back-off grows with the failures still inside the window, so an engine that
            # crashes once a day restarts at once while a crash loop slows down.
            delay = min(self.settings.backoff_initial_s * 2 ** (n - 1), self.settings.backoff_max_s)
            r.restarts += 1
            r.logs.append(f"{MARK} engine {why}; restart {r.restarts} in {delay:g}s")
            self._set(r, "pending", f"the engine {why}; restarting in {delay:g}s")
            await self.clock.sleep(delay)

    async def _run_once(self, r: _Replica, launch: Launch) -> str:
        """Run the engine until it exits; returns why it ended, as a phrase."""
        r.reason = ""
        self._set(r, "starting", "")
        try:
            proc = await self._spawn(launch, r.logs.append)
        except OSError as exc:
            r.logs.append(f"{MARK} cannot start {launch.argv[0]}: {exc}")
            return f"could not start ({launch.argv[0]}: {exc.strerror or exc})"
        r.proc, r.pid = proc, proc.pid
        self._emit(r)
        exited: asyncio.Task[int] = asyncio.create_task(proc.wait())
        try:
            why = await self._until_exit(r, launch, proc, exited)
        finally:
            if not exited.done():  # cancelled (stop during a back-off race): leave nothing running
                proc.signal(signal.SIGKILL)
                await asyncio.shield(exited)
            r.proc = None
        return why

    async def _until_exit(self, r: _Replica, launch: Launch, proc: EngineProcess,
                          exited: asyncio.Task[int]) -> str:  # fmt: skip
        deadline = self.clock.monotonic() + self.settings.start_timeout_s
        while not exited.done() and not r.stopping:
            if await self._probe(launch):
                if not exited.done() and not r.stopping:
                    self._set(r, "ready", "")
                break
            if self.clock.monotonic() >= deadline:
                r.logs.append(f"{MARK} not ready after {self.settings.start_timeout_s:g}s: SIGKILL")
                proc.signal(signal.SIGKILL)
                await exited
                return f"was not ready within {self.settings.start_timeout_s:g}s"
            await race(self.clock, exited, self.settings.probe_interval_s)
        code = await exited
        return describe_exit(code)

    # ---- helpers ----------------------------------------------------------------------

    def _set(self, r: _Replica, state: State, reason: str) -> None:
        r.state, r.reason = state, reason
        self._emit(r)

    def _emit(self, r: _Replica) -> None:
        self.on_status(r.info())

    def _refuse(self, req: LaunchRequest, why: str, *, keep: bool) -> ReplicaInfo:
        """The replica parked without running, `cannot start: why`, and told to `on_status`."""
        r = _Replica(req, self.settings.log_lines)
        r.state, r.reason = "parked", f"cannot start: {why}"
        if keep:
            self._replicas[req.replica_id] = r
        self._emit(r)
        return r.info()

    def _with_ports(self, req: LaunchRequest) -> LaunchRequest:
        """`req` with a port from the range where it has none (and KV event ports for the
        engines that publish them); NoFreePortError when the range is full."""
        if req.port == 0:
            req = msgspec.structs.replace(req, port=self._pick_port())
        if req.engine in KV_EVENTS and req.kv_events_port == 0:
            events = self._pick_port(req.port)
            req = msgspec.structs.replace(req, kv_events_port=events,
                                          kv_replay_port=self._pick_port(req.port, events))
        return req

    def _pick_port(self, *also: int) -> int:
        """A free port of the range that no running replica (nor `also`) holds."""
        low, high = self.settings.port_range
        taken = set(also)
        for r in self._replicas.values():
            if r.live:
                taken.update((r.req.port, r.req.kv_events_port, r.req.kv_replay_port))
        for port in range(low, high + 1):
            if port not in taken and self._port_free(self.settings.engine_host, port):
                return port
        raise NoFreePortError(f"no free port in {low}-{high} for an engine")


def _bindable(host: str, port: int) -> bool:
    """True when nothing listens on `port` now (another program may hold ports of the range)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
