"""What the control plane is told at start: where it keeps its files and store, where it listens,
and the settings handlers read (`ControlPlane.settings`).

The settings come from the `control_plane:` section of `server.yaml`; the rest
from `llmgw server`'s flags. All of it crosses to granian's worker as one JSON
object in an environment variable (never a secret: the worker reads those from
the data dir itself).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from llmgw.config import is_loopback
from llmgw.config.units import Duration, DurationOrZero
from llmgw.control.catalog import Model

CONFIG_ENV = "LLMGW_CONTROL_CONFIG"


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The control plane's settings, as handlers read them: the `control_plane:` section.

    Every duration is written `30s`, `5m`, `7d` (`llmgw.config.units`) or as a number of
    seconds, and held in seconds.
    """

    max_key_ttl: Duration | None = None
    """The longest lifetime of an API key anywhere in this cluster; None: no maximum."""
    gateway_url: str | None = None
    """Where a gateway answers (replays go there); None: replay is not available."""
    request_retention: Duration = 30 * 86400
    """How long request records are kept (the hourly rollups are kept for good)."""
    gateway_silent_for: Duration = 10.0
    """A gateway worker not heard from for this long is gone: its open requests are settled
    as `interrupted`. Gateways send a batch (empty when idle) every fraction of a second."""
    admin_header_timeout: Annotated[Duration, msgspec.Meta(le=60)] = 10.0
    """How long a client of the admin listener has to send its request headers: from its first
    byte (granian), or from the connect for one that sends nothing (`llmgw/net/silent.py`). An
    idle keep-alive connection is closed after as long; a gateway posts usage and calls for
    leases several times a second, and its snapshot poll is a request in flight."""
    cpu_scheduling: Literal["batch", "normal"] = "batch"
    """How Linux schedules the control plane's threads. `batch` (SCHED_BATCH): its fair share
    of CPU, but waking up (a usage batch, a lease call) never preempts another process, so
    on a machine it shares with gateways their request path is not cut short to ingest
    usage; `normal`: the default policy, as for any process."""

    # -- leadership: several control planes on one PostgreSQL ------------------------------
    leader_lease_ttl: Duration = 10.0
    """How long the leader lease lasts; the leader renews it every third of that. A standby
    takes over within about 4/3 of it after the leader dies (unused on SQLite)."""
    advertise_admin_url: str | None = None
    """Where standbys reach this control plane's admin API when it leads; None:
    http://HOST:PORT of `llmgw server --host --port` (set it when HOST is 0.0.0.0)."""
    advertise_agent_address: str | None = None
    """HOST:PORT standbys send agents to when this one leads; None: agent_host:agent_port."""

    # -- the fleet: agents, placement, replicas ------------------------------------------
    agent_host: str = "127.0.0.1"
    """Where the agent service listens (gRPC; `llmgw agent --control-plane HOST:PORT`)."""
    agent_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8082
    """0: a free port the kernel picks; `llmgw server`'s ready line names it."""
    agent_join_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    """Where agents with a join token get their certificate (TLS without client
    certificates, `Join` only); 0: agent_port + 1, or a picked one where agent_port is 0."""
    agent_insecure: bool = False
    """Plaintext agent streams, allowed only on a loopback `agent_host`. Without it the agent
    port is mutual TLS with the CA of `llmgw server init`; without that CA the agent port
    stays closed (the control plane still runs, and says so)."""
    reconcile_every: Duration = 1.0
    """Time between reconcile passes; every agent event also starts one."""
    placement_settle: DurationOrZero = 0.0
    """Time after start before the first replica is placed, so that the agents of a
    cluster that starts together have all registered and replicas spread over them rather
    than fill the first node that came up. 0: place at once."""
    unreachable_after: Duration = 30.0
    """A node without a heartbeat this long is unreachable (its replicas are still routed)."""
    lost_after: Duration = 120.0
    """A node without a heartbeat this long is lost: its replicas are placed elsewhere."""
    heartbeat_interval: Duration = 5.0
    """What agents are told: the time between their heartbeats."""
    max_failures: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 5
    """Engine crashes within `failure_window` that park a replica."""
    failure_window: Duration = 600.0
    restart_backoff_initial: Duration = 1.0
    restart_backoff_max: Duration = 60.0
    drain_timeout: Duration = 30.0
    """How long a stopped replica gets to finish its requests in flight before SIGKILL."""
    engine_log_lines: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 500
    """Engine output lines each agent keeps per replica (`ctl nodes logs`)."""
    replica_retention: Duration = 3600.0
    """Stopped replicas are listed (and their ids not reused) this long."""

    @property
    def join_port(self) -> int:
        """The join port in use (`agent_join_port`, or the agent port + 1; 0 while both are 0,
        until `llmgw server` picks them)."""
        return self.agent_join_port or (self.agent_port + 1 if self.agent_port else 0)

    def __post_init__(self) -> None:
        if self.lost_after <= self.unreachable_after:
            raise ValueError(f"lost_after ({self.lost_after:g} s) must be longer than "
                             f"unreachable_after ({self.unreachable_after:g} s)")
        if self.heartbeat_interval >= self.unreachable_after:
            raise ValueError(f"heartbeat_interval ({self.heartbeat_interval:g} s) must be shorter "
                             f"than unreachable_after ({self.unreachable_after:g} s), or every "
                             "node would be unreachable between two heartbeats")
        join = self.join_port
        if not self.agent_insecure and join and join in (self.agent_port, 65536):
            raise ValueError(f"agent_join_port ({self.join_port}) must be a port (1-65535) other "
                             f"than agent_port ({self.agent_port}): it serves TLS without client "
                             "certificates, the agent port requires them")
        if self.agent_insecure and not is_loopback(self.agent_host):
            raise ValueError(f"agent_insecure (plaintext) is allowed only on a loopback "
                             f"agent_host, and {self.agent_host} is not; agents on other "
                             "machines need mutual TLS")


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Everything one control plane process is started with."""

    data_dir: str
    store: str
    host: str = "127.0.0.1"
    port: int = 8081
    settings: Settings = msgspec.field(default_factory=Settings)
    models: list[Model] = msgspec.field(default_factory=list)
    """The `models:` of server.yaml, validated (models added at runtime are in the store)."""
    agent_ports_held: bool = False
    """Whether `llmgw server` picked the agent service's ports (agent_port 0) and holds them
    bound with SO_REUSEPORT: the worker's gRPC server then binds them with it too, to join."""


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/llmgw`, or `~/.local/share/llmgw`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmgw"


def encode_config(cfg: ServerConfig) -> str:
    """The config as JSON text, for the worker's environment."""
    return msgspec.json.encode(cfg).decode()


def decode_config(text: str) -> ServerConfig:
    """Inverse of encode_config."""
    return msgspec.json.decode(text, type=ServerConfig)


def port_taken(address: str, why: object, setting: str) -> str:
    """What an operator reads when the agent service cannot listen on `address`: `llmgw
    server`'s check before it starts, and the bind itself should the port go in between."""
    return (f"cannot listen for agents on {address}: {why}; another process holds that port "
            f"(another control plane?). Stop it, or set control_plane.{setting} in --config "
            "to a free port")
