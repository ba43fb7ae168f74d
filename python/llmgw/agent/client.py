"""The agent's side of the stream: register, heartbeat, obey commands, report; reconnect after a cut.

One stream at a time, to one control plane of the list; after a cut (or a
refusal by a standby) the agent tries the next one, or the leader a standby
named, with exponential back-off. Every stream starts with a full Register that
lists the replicas still running, so a control plane that restarted, or a new
leader, learns the node's state without restarting anything.

Plaintext is allowed only to a loopback control plane and only when asked
(`insecure=True`); everything else is mutual TLS from the given files, read at
each connect so that renewed certificates are used without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
import msgspec

from llmgw import __version__, config
from llmgw.agent import wire
from llmgw.agent.clock import Clock, RealClock
from llmgw.agent.inventory import HostFacts, Inventory, sample_load
from llmgw.agent.supervisor import ReplicaInfo, Supervisor
from llmgw.engines.launch import available_engines
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceStub

log = logging.getLogger("llmgw.agent")
_LEADER = re.compile(r"leader=(\S+)")


class AgentConfig(msgspec.Struct, kw_only=True):
    """Who the agent is and how it reaches the control plane."""

    control_planes: tuple[str, ...]
    node_id: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    advertise_address: str = ""
    heartbeat_interval_s: float = 5.0
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0
    drain_s: float = 30.0
    """How long replicas get to finish their requests when the agent itself stops."""


class AgentConfigError(ValueError):
    """A setting that cannot work; the message is a sentence for the operator."""


def is_loopback(target: str) -> bool:
    """True when `target` (HOST:PORT, [V6]:PORT) names this machine's loopback."""
    host = target.rsplit(":", 1)[0] if not target.startswith("[") else target[1:].split("]")[0]
    return config.is_loopback(host)


def check_config(config: AgentConfig) -> None:
    """Raise AgentConfigError unless every control plane can be reached as configured."""
    if not config.control_planes:
        raise AgentConfigError("no control plane given; pass --control-plane HOST:PORT")
    if config.insecure:
        remote = [t for t in config.control_planes if not is_loopback(t)]
        if remote:
            raise AgentConfigError(
                f"--insecure (plaintext) is allowed only to a control plane on loopback, and "
                f"{', '.join(remote)} is not; give --cert, --key and --ca for mutual TLS instead"
            )
        return
    missing = [n for n, v in (("--cert", config.cert_file), ("--key", config.key_file),
                              ("--ca", config.ca_file)) if not v]  # fmt: skip
    if missing:
        raise AgentConfigError(
            f"mutual TLS needs {', '.join(missing)}; pass the node's certificate, key and the "
            f"cluster CA, or --insecure for a control plane on this machine"
        )


def open_channel(target: str, config: AgentConfig) -> grpc.aio.Channel:
    """A channel to `target`: plaintext only for an allowed loopback target, else mutual TLS."""
    options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
               ("grpc.keepalive_permit_without_calls", 1)]  # fmt: skip
    if config.insecure and is_loopback(target):
        return grpc.aio.insecure_channel(target, options=options)
    assert config.cert_file and config.key_file and config.ca_file  # check_config ran
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(config.ca_file).read_bytes(),
        private_key=Path(config.key_file).read_bytes(),
        certificate_chain=Path(config.cert_file).read_bytes(),
    )
    return grpc.aio.secure_channel(target, creds, options=options)


class Agent:
    """The node agent: one `Supervisor` and the stream to the control plane."""

    def __init__(self, config: AgentConfig, inventory: Inventory, host: HostFacts,
                 supervisor: Supervisor, *, clock: Clock | None = None) -> None:  # fmt: skip
        check_config(config)
        self.config = config
        self.inventory = inventory
        self.host = host
        self.supervisor = supervisor
        supervisor.on_status = self._on_status
        self.clock: Clock = clock or RealClock()
        self.boot_id = uuid.uuid4().hex
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self.connected = asyncio.Event()
        """Set while a stream is registered; tests and `llmgw up` wait on it."""
        self.registrations = 0
        self._outbox: asyncio.Queue[pb.AgentMessage] | None = None
        self._seq = 0
        self._closing = False
        self._commands: set[asyncio.Task[None]] = set()

    # ---- life cycle ------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a stream to some control plane until `shutdown`."""
        targets = list(self.config.control_planes)
        i = 0
        delay = self.config.reconnect_initial_s
        while not self._closing:
            target = targets[i % len(targets)]
            before = self.registrations
            try:
                await self._session(target)
            except grpc.aio.AioRpcError as exc:
                m = _LEADER.search(exc.details() or "")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and m:
                    # A standby: it named the leader; go there next, with no wait.
                    if m[1] not in targets:
                        targets.append(m[1])
                    i = targets.index(m[1])
                    log.info("control plane %s is a standby; moving to the leader %s", target, m[1])
                    continue
                log.warning("stream to control plane %s ended: %s %s", target, exc.code().name, exc.details())
            except (OSError, ConnectionError) as exc:
                log.warning("stream to control plane %s failed: %s", target, exc)
            if self._closing:
                break
            if self.registrations > before:
                delay = self.config.reconnect_initial_s  # it worked: a cut is not a failure streak
            i += 1
            await self.clock.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_max_s)

    async def shutdown(self, drain_s: float | None = None) -> None:
        """Stop reconnecting and drain every replica (SIGTERM, then SIGKILL after `drain_s`)."""
        self._closing = True
        await self.supervisor.close(self.config.drain_s if drain_s is None else drain_s)

    # ---- one stream ------------------------------------------------------------------

    async def _session(self, target: str) -> None:
        async with open_channel(target, self.config) as channel:
            call = AgentServiceStub(channel).Connect()
            await call.write(pb.AgentMessage(register=self._register()))
            outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
            self._outbox = outbox
            self.registrations += 1
            self.connected.set()
            log.info("registered with control plane %s as node %s", target, self.config.node_id)
            writer = asyncio.create_task(self._write(call, outbox))
            beat = asyncio.create_task(self._heartbeats(outbox))
            try:
                while True:
                    msg = await call.read()
                    if not isinstance(msg, pb.ControlMessage):  # EOF: the server closed
                        break
                    self._handle(msg, outbox)
                    if writer.done():
                        writer.result()  # a failed write ends the session with its error
            finally:
                self._outbox = None
                self.connected.clear()
                writer.cancel()
                beat.cancel()
                call.cancel()
                await asyncio.gather(writer, beat, return_exceptions=True)

    async def _write(self, call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControlMessage],
                     outbox: asyncio.Queue[pb.AgentMessage]) -> None:  # fmt: skip
        # The only coroutine that writes: grpc.aio calls must not be written concurrently.
        while True:
            await call.write(await outbox.get())

    async def _heartbeats(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        while True:
            await self.clock.sleep(self.heartbeat_interval_s)
            outbox.put_nowait(pb.AgentMessage(heartbeat=await self._heartbeat()))

    async def _heartbeat(self) -> pb.Heartbeat:
        self._seq += 1
        if any(not g.simulated for g in self.inventory.gpus):
            samples = await asyncio.to_thread(sample_load, self.inventory)  # NVML blocks
        else:
            samples = sample_load(self.inventory)
        return pb.Heartbeat(
            seq=self._seq, gpus=[wire.gpu_load(s) for s in samples],
            replicas=[wire.replica_status(r) for r in self.supervisor.statuses()],
        )  # fmt: skip

    def _register(self) -> pb.Register:
        return wire.register(
            node_id=self.config.node_id, host=self.host, inventory=self.inventory,
            labels=self.config.labels, engines=available_engines(), version=__version__,
            boot_id=self.boot_id, advertise_address=self.config.advertise_address,
            replicas=self.supervisor.statuses(),
        )  # fmt: skip

    # ---- commands --------------------------------------------------------------------

    def _handle(self, msg: pb.ControlMessage, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        kind = msg.WhichOneof("msg")
        if kind == "start_replica":
            # A start that cannot run comes back parked with the reason, through _on_status.
            self.supervisor.start(wire.launch_request(msg.start_replica, self.inventory.simulated))
        elif kind == "stop_replica":
            m = msg.stop_replica
            self._spawn_command(self.supervisor.stop(m.replica_id, float(m.drain_seconds)))
        elif kind == "drain":
            self._spawn_command(self.supervisor.drain(float(msg.drain.drain_seconds)))
        elif kind == "request_logs":
            rid = msg.request_logs.replica_id
            lines = self.supervisor.logs(rid, msg.request_logs.lines) or []
            outbox.put_nowait(pb.AgentMessage(engine_logs=pb.EngineLogs(replica_id=rid, lines=lines)))
        elif kind == "settings":
            self._apply(msg.settings)
        # ack: nothing to do; unknown kinds come from a newer control plane: ignored

    def _apply(self, s: pb.Settings) -> None:
        if s.heartbeat_interval_ms:
            self.heartbeat_interval_s = s.heartbeat_interval_ms / 1000
        self.supervisor.update_policy(
            max_failures=s.max_failures, failure_window_s=float(s.failure_window_s),
            backoff_initial_s=s.restart_backoff_initial_ms / 1000,
            backoff_max_s=s.restart_backoff_max_ms / 1000, log_lines=s.log_lines,
        )  # fmt: skip

    def _spawn_command(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._commands.add(task)  # held so it is not collected mid-drain
        task.add_done_callback(self._commands.discard)

    def _on_status(self, info: ReplicaInfo) -> None:
        # While disconnected a change is not queued: the next Register lists every replica.
        if self._outbox is not None:
            self._outbox.put_nowait(pb.AgentMessage(replica_status=wire.replica_status(info)))
