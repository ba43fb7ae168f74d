"""The `gateway:` section of server.yaml as msgspec Structs, with every default in one place.

Validation happens once, at load (`llmgw.config.file`), and a bad field is reported with its
path (`$.gateway.endpoints[0].url`) so the operator can find it without guessing. The section
crosses into granian's workers as JSON (`encode_gateway`) and is decoded there again.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from .units import Duration, PositiveSize

CONFIG_ENV = "LLMGW_GATEWAY_CONFIG"
"""How `llmgw gateway` hands its configuration to granian's worker processes."""


class ConfigError(Exception):
    """A configuration llmgw cannot run with; the message is for the operator.

    `errors` holds each fault as `$.path: what is wrong; what to do`, in the order of the file,
    when the configuration was checked against the schema (empty for one fault of another kind:
    a file that cannot be read, a flag).
    """

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors: list[str] = errors or []


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """`host` as the host part of a URL or a HOST:PORT address: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def check_http_url(url: str, what: str) -> None:
    """ValueError `{what}; expected http://HOST:PORT` unless `url` is http://HOST[:PORT].

    The one check of every URL the gateway is configured with (endpoints, control planes);
    `what` names the field and its value for the operator.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{what}; expected http://HOST:PORT")


class Endpoint(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One engine replica: an OpenAI-compatible HTTP server and the models it serves."""

    id: str
    url: str
    models: list[str]
    kv_events: str | None = None
    """The replica's KV-event publisher (vLLM `--kv-events-config` endpoint), e.g.
    tcp://10.0.0.5:5557."""
    kv_replay: str | None = None
    """Its replay endpoint, e.g. tcp://10.0.0.5:5558; without it a lost batch drops the
    replica's entries."""

    def __post_init__(self) -> None:
        check_http_url(self.url, f"endpoint {self.id!r} has url {self.url!r}")
        if not self.models:
            raise ValueError(f"endpoint {self.id!r} serves no model; give at least one")

    @property
    def host(self) -> str:
        """The host part of the URL."""
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        """The port part of the URL (80 when absent)."""
        return urlsplit(self.url).port or 80


class Timeouts(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-phase deadlines of one upstream request (durations: `2s`, `250ms`, or seconds)."""

    connect: Duration = 2.0
    """Opening a TCP connection to a replica."""
    first_byte: Duration = 60.0
    """From sending the request to the upstream's response headers (covers queueing and prefill)."""
    idle: Duration = 30.0
    """Longest silence between two body chunks of an answer."""
    total: Duration = 600.0
    """The whole request, retries included."""
    client_headers: Duration = 10.0
    """A client must have sent its request headers this long after connecting (slowloris)."""
    client_body: Duration = 30.0
    """A client must have sent its whole request body this long after its headers (slow
    uploads): 408. granian bounds only the headers."""
    client_idle: Duration = 30.0
    """Longest a client may leave its streamed answer unread once it is far behind (slow
    readers: see `gateway/slow_reader.py`): the engine's request is then cancelled."""


class HealthChecks(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`gateway.health`: active probes and passive ejection of replicas (the control plane's
    `/health` answer is another thing, `admin.meta.Health`)."""

    probe_interval: Duration = 5.0
    probe_timeout: Duration = 2.0
    eject_base: Duration = 1.0
    """First ejection after a connect error or 5xx; doubles with each further ejection."""
    eject_max: Duration = 60.0
    max_ejection_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = 50
    """At most this share of a model's replicas is out of routing at once for errors
    (Envoy's `max_ejection_percent`, counting replicas out for a failed probe too): a
    replica whose ejection would take more out keeps serving, so a burst of 5xx on every
    replica never leaves a model with none to try. At 50 one of two replicas may be
    ejected, and the only one never is; 100 lets ejection take every replica out (503
    until the first comes back)."""


class RetryBudget(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Retries across requests, per worker (`gateway.retry_budget`): when every replica fails,
    retries stop multiplying the load on them."""

    ratio: Annotated[float, msgspec.Meta(ge=0)] = 0.2
    """Retries per request sent, over the last ten seconds or so: 0.2 adds at most a fifth
    more tries; 0 leaves only `min_per_second`."""
    min_per_second: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """Retries a worker may make each second whatever its rate, so that a quiet gateway
    still retries its few failures."""


class ControlPlaneLink(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`gateway.control_plane`: where the gateway gets its keys and limits and sends its usage
    (`llmgw server`; not the control plane's own `control_plane:` section, which is
    `llmgw.control.settings.Settings`).

    Without this section the gateway is open: no key is asked for and no limit applies.
    """

    url: str | list[str]
    """The control plane's admin listener, e.g. http://127.0.0.1:8081; or several control
    planes on one PostgreSQL (a list, or URLs separated by commas): the gateway talks to one
    at a time and moves to the next when one cannot be reached or answers 503."""
    data_dir: str | None = None
    """The control plane's data directory: the gateway token and the key-hash secret are
    derived from its `secret`. Else they come from LLMGW_GATEWAY_TOKEN and
    LLMGW_KEY_HASH_SECRET (hex), for a gateway on another machine."""
    snapshot_wait: Duration = 20.0
    """Longest a snapshot long-poll waits on the control plane before it answers anyway."""
    usage_interval: Duration = 0.25
    """Usage batches leave this often: with the lease calls (every 0.25 s), on the one nearest
    to it, when it is at least that long."""
    usage_max_pending: Annotated[int, msgspec.Meta(ge=1)] = 200_000
    """Records held while the control plane does not take them; past it new ones are dropped
    (and counted in the log), so an outage cannot exhaust the gateway's memory."""
    lease_wait: Duration = 0.5
    """Longest a request waits for a limits lease before the fail mode applies."""
    lease_idle_return: Duration = 0.5
    """Concurrency slots unused this long are given back for other gateways to use."""
    limits_fail_open: bool = False
    """When the control plane cannot be reached: False answers 503 (limits hold), True forwards
    without limits (availability first; the requests are still recorded)."""

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("control_plane.url is empty; give http://HOST:PORT (or several)")
        for url in self.urls:
            check_http_url(url, f"control_plane.url is {url!r}")

    @property
    def urls(self) -> list[str]:
        """Every control plane's URL, in the order given (the first is tried first)."""
        given = self.url.split(",") if isinstance(self.url, str) else self.url
        return [u.strip() for u in given if u.strip()]


class GatewayConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Everything `llmgw gateway` needs; crosses into the workers as one JSON value."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10_000
    """Client connections served at once, across the workers; more wait in the kernel's accept
    queue. A streamed answer holds its connection for as long as it runs. Each is a descriptor:
    the gateway raises its descriptor limit to the most it may (`ulimit -Hn`) and says so when
    that is still too few."""
    max_body_bytes: PositiveSize = 16 * 1024 * 1024
    """Largest request body a client may send (`16MiB`, or a number of bytes): 413 past it."""
    max_response_bytes: PositiveSize = 64 * 1024 * 1024
    """Largest non-streamed upstream answer read before giving up with 502."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 1
    """Further replicas tried when one fails before the first byte reached the client."""
    retry_budget: RetryBudget = msgspec.field(default_factory=RetryBudget)
    retry_after_seconds: Annotated[int, msgspec.Meta(ge=1)] = 1
    endpoints: list[Endpoint] = msgspec.field(default_factory=list)
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    """Client-visible model name -> the name the replicas serve."""
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    health: HealthChecks = msgspec.field(default_factory=HealthChecks)
    usage_log: str | None = None
    """Append one JSON line per finished request to this file (batched, off the request path)."""
    kv_block_size: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 16
    """The engines' KV-cache block size in tokens (vLLM's --block-size), for the KV-event index."""
    routing: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Per served model: the routing policy and its settings (`policy`, `weights`, `guard_abs`,
    ...; validated by the Rust router, which holds their defaults), plus `tokenizer`, a model
    directory that makes `kv` mode precise."""
    control_plane: ControlPlaneLink | None = None
    """Keys, limits and usage through `llmgw server`; None runs the gateway open (bench mode)."""

    def __post_init__(self) -> None:
        ids = [e.id for e in self.endpoints]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"endpoint ids must be unique; repeated: {', '.join(sorted(dup))}")
        served = {m for e in self.endpoints for m in e.models}
        # With a control plane, the models it places (its catalog) are served too; the
        # gateway learns them only from its snapshot, so names are checked here only
        # against the configured endpoints when there is no control plane.
        placed = self.control_plane is not None
        for model, settings in self.routing.items():
            if model not in served and not placed:
                raise ValueError(f"routing is set for model {model!r}, which no endpoint serves")
            tok = settings.get("tokenizer")
            if tok is not None and not isinstance(tok, str):
                raise ValueError(f"routing.{model}.tokenizer must be a directory path")
        for alias, target in self.aliases.items():
            if target not in served and not placed:
                raise ValueError(
                    f"alias {alias!r} points to {target!r}, which no endpoint serves"
                )


def parse_endpoint(spec: str) -> Endpoint:
    """Parses `--endpoint ID=URL=MODEL[,MODEL]`."""
    parts = spec.split("=", 2)
    if len(parts) != 3 or not all(parts):
        raise ConfigError(
            f"--endpoint {spec!r} is not ID=URL=MODEL[,MODEL]; "
            "example: --endpoint r1=http://127.0.0.1:8000=llama-3-8b"
        )
    rid, url, models = parts
    try:
        return Endpoint(id=rid, url=url, models=[m for m in models.split(",") if m])
    except ValueError as e:
        raise ConfigError(f"--endpoint {spec!r}: {e}") from e


def encode_gateway(cfg: GatewayConfig) -> bytes:
    """The config as JSON, for handing to granian's worker processes."""
    return msgspec.json.encode(cfg)


def decode_gateway(data: bytes | str) -> GatewayConfig:
    """Inverse of encode_gateway; validation runs again in the worker."""
    try:
        return msgspec.json.decode(data, type=GatewayConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"gateway configuration is invalid: {e}") from e
