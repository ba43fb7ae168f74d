"""The agent service: the gRPC server agents stream to, on the control plane's own event loop.

Each agent holds one `Connect` stream. Its first message must be Register; the
answer starts with Settings (heartbeat interval, restart and park policy), then
carries commands. Everything an agent says is turned into the plain values of
`llmgw.control.reports` here, so the fleet never sees protobuf or gRPC.

Plaintext is served only on a loopback address and only with `agent_insecure:
true`. Otherwise the agent port is mutual TLS with the cluster CA of `llmgw
server init` (a client certificate from another CA fails the handshake), and a
second port, the join port, is TLS without client certificates and serves only
`Join`: a node with a join token gets its certificate there. gRPC cannot ask for a
client certificate without requiring it, hence two ports rather than one. `Connect`
also checks that the certificate names the node it registers and that the store
has not revoked it (the node was removed).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from llmgw.config import is_loopback
from llmgw.control.catalog import Model, Profile
from llmgw.control.fleet import Fleet
from llmgw.control.inventory import Gpu, Replica, ReplicaState, gpu_class_of
from llmgw.control.pki import Authority, PkiError, peer_identity, pem, serial_hex
from llmgw.control.reports import NodeFacts, Registration, Status
from llmgw.control.settings import Settings, port_taken
from llmgw.secrets.keys import parse_join_token
from llmgw.store import joins
from llmgw.store.errors import Forbidden
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceServicer, add_AgentServiceServicer_to_server

log = logging.getLogger("llmgw.control.agents")

STATES: dict[int, ReplicaState] = {
    pb.REPLICA_STATE_PENDING: "pending",
    pb.REPLICA_STATE_STARTING: "starting",
    pb.REPLICA_STATE_READY: "ready",
    pb.REPLICA_STATE_DRAINING: "draining",
    pb.REPLICA_STATE_STOPPED: "stopped",
    pb.REPLICA_STATE_PARKED: "parked",
}
READY_LINE = "llmgw agent service listening on"

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")

_CLOSE: Any = object()
"""Put in a link's outbox to end its stream."""


def status(s: pb.ReplicaStatus) -> Status:
    """The fleet's form of one replica status (an unknown state reads as pending)."""
    return Status(replica_id=s.replica_id, model=s.model, state=STATES.get(s.state, "pending"),
                  port=s.port, pid=s.engine_pid, restarts=s.restarts, reason=s.reason,
                  kv_events_port=s.kv_events_port, kv_replay_port=s.kv_replay_port)


def peer_host(peer: str) -> str:
    """The IP of a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`), or ''."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return ""
        return host
    return ""


def registration(reg: pb.Register, peer: str) -> Registration:
    """The fleet's form of a Register, with GPU classes and NVLink peers as indices."""
    index = {g.uuid: g.index for g in reg.gpus}
    gpus = [Gpu(uuid=g.uuid, index=g.index, model=g.model,
                gpu_class=gpu_class_of(g.model, g.memory_total_bytes),
                memory_total=g.memory_total_bytes, memory_free=g.memory_free_bytes,
                nvlink_peers=tuple(sorted(index[p] for p in g.nvlink_peers if p in index)),
                simulated=g.simulated) for g in reg.gpus]
    facts = NodeFacts(gpus=gpus, cpu_cores=float(reg.cpu_count), memory_bytes=reg.memory_bytes,
                      engines=sorted(e.name for e in reg.engines), gpu_note=reg.gpu_note,
                      agent_version=reg.agent_version, boot_id=reg.boot_id,
                      address=reg.advertise_address or peer_host(peer))
    return Registration(node_id=reg.node_id, hostname=reg.hostname, labels=dict(reg.labels),
                        facts=facts, replicas=tuple(status(s) for s in reg.replicas))


def agent_settings(s: Settings) -> pb.Settings:
    """What every agent is told when it registers."""
    return pb.Settings(
        heartbeat_interval_ms=round(s.heartbeat_interval * 1000), max_failures=s.max_failures,
        failure_window_s=max(1, round(s.failure_window)),
        restart_backoff_initial_ms=round(s.restart_backoff_initial * 1000),
        restart_backoff_max_ms=round(s.restart_backoff_max * 1000),
        log_lines=s.engine_log_lines)


class Link:
    """One agent's stream as the fleet sees it: commands go to its outbox."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()

    def send(self, **kw: Any) -> None:
        self.outbox.put_nowait(pb.ControlMessage(**kw))

    def start(self, replica: Replica, model: Model, profile: Profile, key: str) -> None:
        """StartReplica for `replica` with its profile's engine, arguments and environment."""
        src = model.source
        self.send(start_replica=pb.StartReplica(
            replica_id=replica.id, model=model.name, engine=profile.engine, args=profile.args,
            env=profile.env, gpu_uuids=list(replica.gpus), port=0, engine_key=key,
            source=src.path or src.repo or ""))

    def stop(self, replica_id: str, drain_s: float) -> None:
        """StopReplica."""
        self.send(stop_replica=pb.StopReplica(replica_id=replica_id,
                                              drain_seconds=max(0, round(drain_s))))

    def request_logs(self, replica_id: str, lines: int) -> None:
        """RequestLogs."""
        self.send(request_logs=pb.RequestLogs(replica_id=replica_id, lines=max(0, lines)))

    def close(self) -> None:
        """Ends the stream."""
        self.outbox.put_nowait(_CLOSE)


class AgentService(AgentServiceServicer):
    """The `Connect` stream of every agent, feeding the leader's `Fleet` (`cp.fleet`).

    The port is open for the whole process, leader or not: a standby answers a stream
    with FAILED_PRECONDITION and `leader=HOST:PORT` in the details, the form
    `llmgw.agent.client` reads to go to the leader at once; with no leader known it
    answers UNAVAILABLE, and the agent backs off and tries its next control plane.
    """

    def __init__(self, cp: Any, authority: Authority | None = None,
                 join_hash_key: bytes = b"") -> None:
        self.cp = cp
        self.authority = authority
        """The cluster CA when the port is mutual TLS; None in plaintext (loopback) mode."""
        self.join_hash_key = join_hash_key

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: grpc.aio.ServicerContext[pb.AgentMessage, pb.ControlMessage],
                      ) -> AsyncIterator[pb.ControlMessage]:
        """One agent's stream: Register first, then its reports; commands go back."""
        fleet: Fleet | None = self.cp.fleet
        leadership = self.cp.leadership
        if fleet is None or leadership is None or not leadership.is_leader:
            other = leadership.other_leader() if leadership is not None else None
            if other is not None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    "this control plane is a standby and takes no agents; "
                                    f"leader={other.agent_address}")
            else:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    "this control plane is a standby and no leader is known "
                                    "yet; try again shortly")
            return
        it = aiter(request_iterator)
        try:
            first = await anext(it)
        except StopAsyncIteration:
            return
        if first.WhichOneof("msg") != "register" or not first.register.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the first message of a stream must be Register with a node_id")
            return
        if self.authority is not None:
            refusal = await self._refusal(context, first.register.node_id)
            if refusal is not None:
                log.warning("refused the stream of node %s: %s", first.register.node_id, refusal)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
                return
        reg = registration(first.register, context.peer())
        link = Link(reg.node_id)
        link.send(settings=agent_settings(fleet.settings))
        await fleet.register(reg, link)
        reader = asyncio.create_task(self._read(fleet, it, link), name=f"agent {reg.node_id}")
        reader.add_done_callback(lambda _: link.close())
        try:
            while True:
                msg = await link.outbox.get()
                if msg is _CLOSE:
                    break
                yield msg
        finally:
            reader.cancel()
            fleet.disconnected(reg.node_id, link)

    async def _refusal(self, context: grpc.aio.ServicerContext[Any, Any], node_id: str,
                       ) -> str | None:
        """Why a stream's client certificate may not register `node_id`; None when it may."""
        certs = list(context.auth_context().get("x509_pem_cert") or ())
        if not certs:
            return ("no client certificate: this is the join port, which serves only Join; "
                    "connect to the agent port with the node's certificate")
        cn, serial = peer_identity(certs[0])
        if cn != node_id:
            return (f"the client certificate is node {cn!r}'s, and the stream registers node "
                    f"{node_id!r}; run the agent with --node-id {cn} or join it again")
        state = await joins.certificate(self.cp.db, serial)
        if state is None:
            return (f"certificate {serial} of node {node_id} was not issued by this cluster's "
                    "control planes (its store does not know it); join the node again with a "
                    "token from `llmgw ctl nodes join-token`")
        if state.revoked_at is not None:
            return (f"node {node_id} was removed (`llmgw ctl nodes remove`) and its certificate "
                    f"{serial} is revoked; to bring it back, run its agent with a new "
                    "--join-token from `llmgw ctl nodes join-token`")
        return None

    async def Join(self, request: pb.JoinRequest,
                   context: grpc.aio.ServicerContext[pb.JoinRequest, pb.JoinResponse],
                   ) -> pb.JoinResponse:
        """Signs a joining node's key for a valid, unused, unexpired join token."""
        if self.authority is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this control plane takes agents in plaintext on loopback "
                                "(agent_insecure: true); run the agent with --insecure instead")
        try:
            token_id, secret, ca_sha256 = parse_join_token(request.token)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if ca_sha256 != self.authority.fingerprint:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"the join token is for the cluster whose CA has SHA-256 "
                                f"{ca_sha256[:16]}..., and this one's is "
                                f"{self.authority.fingerprint[:16]}...; use a token of this cluster")
        if not _NODE_ID.match(request.node_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"node id {request.node_id[:64]!r} is not 1-253 letters, digits, "
                                "'.', '_' or '-' starting with a letter or digit; pass --node-id")
        try:
            cert = self.authority.sign_node(request.node_id, request.csr_pem)
        except PkiError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            await joins.redeem(self.cp.db, self.join_hash_key, token_id, secret,
                               request.node_id, serial_hex(cert),
                               cert.not_valid_after_utc.timestamp())
        except Forbidden as e:
            log.warning("refused a join as node %s: %s", request.node_id, e.message)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, e.message)
        log.info("node %s joined with token %s (certificate %s)", request.node_id, token_id,
                 serial_hex(cert))
        return pb.JoinResponse(certificate_pem=pem(cert), ca_pem=self.authority.ca_pem)

    async def _read(self, fleet: Fleet, it: AsyncIterator[pb.AgentMessage], link: Link) -> None:
        node = link.node_id
        try:
            async for msg in it:
                kind = msg.WhichOneof("msg")
                if kind == "heartbeat":
                    hb = msg.heartbeat
                    await fleet.report(node, link, [status(s) for s in hb.replicas], True,
                                            {g.uuid: g.memory_free_bytes for g in hb.gpus})
                elif kind == "replica_status":
                    await fleet.report(node, link, [status(msg.replica_status)], False)
                elif kind == "engine_logs":
                    fleet.logs_arrived(msg.engine_logs.replica_id, list(msg.engine_logs.lines))
                # register again on one stream, kv_events: not used yet
        except grpc.aio.AioRpcError:
            pass  # the stream was cut; the agent reconnects
        except Exception:
            log.exception("the stream of node %s failed", node)


def _server(ports_held: bool = False) -> grpc.aio.Server:
    """SO_REUSEPORT off, so that a second control plane cannot share the port, except where
    `llmgw server` picked the ports and holds them bound (`ports_held`): its sockets listen
    nowhere, and this server must set the option to bind beside them."""
    return grpc.aio.server(options=[("grpc.so_reuseport", int(ports_held)),
                                    ("grpc.keepalive_permit_without_calls", 1),
                                    ("grpc.http2.min_ping_interval_without_data_ms", 5000)])


def _listen(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials | None,
            setting: str) -> None:
    try:
        if creds is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, creds)
    except RuntimeError as e:
        raise RuntimeError(port_taken(address, e, setting)) from e


async def serve(cp: Any, settings: Settings, data_dir: Path | None = None,
                join_hash_key: bytes = b"", ports_held: bool = False) -> grpc.aio.Server | None:
    """Starts the agent service for control plane `cp`, or says why it does not and returns
    None. `ports_held`: `llmgw server` picked the ports and holds them (`_server`)."""
    address = f"{settings.agent_host}:{settings.agent_port}"
    if settings.agent_insecure:
        if not is_loopback(settings.agent_host):  # Settings refuses this at load too
            raise RuntimeError(f"agent_insecure is allowed only on loopback, not {settings.agent_host}")
        server = _server(ports_held)
        add_AgentServiceServicer_to_server(AgentService(cp), server)
        _listen(server, address, None, "agent_port")
        await server.start()
        log.info("%s %s (plaintext, loopback only)", READY_LINE, address)
        return server
    try:
        if data_dir is None:
            raise PkiError("no data dir to read the cluster CA from")
        authority = Authority(data_dir)
    except PkiError as e:
        log.info("the agent port is closed: %s", e)  # `llmgw server` warned at start
        return None
    pair = [(authority.server_key_pem, authority.server_cert_pem)]
    server = _server(ports_held)
    add_AgentServiceServicer_to_server(AgentService(cp, authority, join_hash_key), server)
    join = f"{settings.agent_host}:{settings.join_port}"
    _listen(server, address, grpc.ssl_server_credentials(pair, authority.ca_pem, True), "agent_port")
    _listen(server, join, grpc.ssl_server_credentials(pair), "agent_join_port")
    await server.start()
    log.info("%s %s (mutual TLS; joins on %s)", READY_LINE, address, join)
    return server
