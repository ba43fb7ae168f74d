"""The messages gateways and the control plane exchange; the only types both sides import.

The gateway never imports the control plane's code and the control plane never
imports the gateway's: they share these Structs and the HTTP paths under
`/internal/v1/` (snapshot, usage, leases, wake), all msgspec-encoded.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Count = Annotated[int, msgspec.Meta(ge=1)]
Tally = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
"""A count the store keeps in a BIGINT: bounded so that no batch can overflow one."""
Instant = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
"""Unix seconds (the bound keeps hour buckets inside a BIGINT)."""
Millis = Annotated[float, msgspec.Meta(ge=0, le=1e12)]
Amount = Annotated[int, msgspec.Meta(ge=0)]

NULL = msgspec.Raw(b"null")
"""An absent raw JSON value. msgspec cannot decode `Raw | None` (a union with Raw only
accepts null), so raw fields are plain `Raw` and `NULL` stands for None: compare with ==.
(A factory, not a default: msgspec's JSON schema cannot show a Raw default.)"""


def _null() -> msgspec.Raw:
    return NULL
Period = Literal["day", "week", "month"]


class Limits(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Limits of one key or one project; None means no limit of that kind."""

    rpm: Count | None = None
    """Requests per minute (a sliding 60-second window)."""
    tpm: Count | None = None
    """Tokens per minute, prompt and completion together."""
    concurrency: Count | None = None
    """Requests in flight at once."""
    budget_tokens: Count | None = None
    """Tokens per `budget_period`, prompt and completion together."""
    budget_period: Period = "month"
    """A calendar day, ISO week or month, in UTC."""


class KeyEntry(msgspec.Struct, kw_only=True):
    """One usable API key as gateways hold it: its keyed hash and who it belongs to."""

    key_id: str
    hash: str
    """Hex keyed hash of the whole key (see llmgw.store.keys); the key itself is never kept."""
    org_id: str
    team_id: str
    project_id: str
    user_id: str | None = None
    expires_at: float | None = None
    """Unix seconds; the gateway answers 401 once it has passed."""
    limits: Limits = msgspec.field(default_factory=Limits)
    keep_bodies: bool = False
    """The key's project keeps request bodies (unless a request says no_store)."""


class ReplicaEntry(msgspec.Struct, kw_only=True):
    """One ready replica the control plane placed: the gateway routes to it."""

    id: str
    model: str
    """The catalog name the replica serves (the name engines are started with)."""
    url: str
    """http://HOST:PORT of the engine."""
    engine_key: str | None = None
    """Sent to the engine as `Authorization: Bearer`; engines the agent started refuse others."""
    kv_events: str | None = None
    kv_replay: str | None = None


class ModelEntry(msgspec.Struct, kw_only=True):
    """A model of the catalog, whether or not a replica of it is ready."""

    name: str
    aliases: list[str] = msgspec.field(default_factory=list)
    scale_from_zero: bool = True
    """A request for it with no ready replica asks the control plane for one and waits."""
    scale_up_timeout: float = 300.0
    """How long such a request waits for the first replica."""


class WakeRequest(msgspec.Struct, kw_only=True):
    """POST /internal/v1/wake: a gateway holds requests for a model with no ready replica."""

    model: str
    """The catalog name (the gateway has already resolved aliases)."""


class WakeReply(msgspec.Struct, kw_only=True):
    """The control plane took the wake: the gateway now waits for a snapshot with a replica."""

    model: str
    replicas: int = 1
    """Replicas the control plane now wants for the model."""


class Snapshot(msgspec.Struct, kw_only=True):
    """Everything a gateway needs to authenticate, limit and route, pushed by the control plane."""

    version: int
    keys: list[KeyEntry] = msgspec.field(default_factory=list)
    """Revoked and deleted keys are simply absent."""
    projects: dict[str, Limits] = msgspec.field(default_factory=dict)
    """Project id -> the project's limits (shared by all its keys)."""
    models: list[ModelEntry] = msgspec.field(default_factory=list)
    """The catalog's models (the control-plane issue); empty when the control plane places none."""
    replicas: list[ReplicaEntry] = msgspec.field(default_factory=list)
    """Ready replicas, added to the gateway's own `endpoints`; draining ones are already gone."""


class UsageRecord(msgspec.Struct, omit_defaults=False, gc=False):
    """What one request used and how it went.

    gc=False (here and in UsageOpen): the fields are strings, numbers and bytes, which
    cannot form a reference cycle, so the collector need not track the records a gateway
    holds between posts or the thousand a control plane decodes per batch. Not kw_only:
    the gateway builds one per request positionally, at an eighth of the keywords' cost,
    so the order of the fields is part of it (tests/unit/test_usage_sink.py pins it).
    """

    request_id: str
    model: str
    """The name the client asked for."""
    upstream_model: str
    replica: str | None
    status: str
    """ok, client_error, upstream_error, timeout, cancelled, no_replica, rate_limited,
    unauthorized; `interrupted` is set by the control plane for a request whose gateway died."""
    http_status: Annotated[int, msgspec.Meta(ge=0, le=999)]
    stream: bool
    prompt_tokens: Tally
    completion_tokens: Tally
    usage_estimated: bool
    """True when the upstream never reported usage (it failed or the client left):
    completion_tokens then counts the generated chunks that reached us."""
    ttft_ms: Millis | None
    duration_ms: Millis
    finish_reason: str | None
    retries: Tally
    started_at: Instant
    route: msgspec.Raw = msgspec.field(default_factory=_null)
    """The router's decision: policy, matched prefix, candidates' scores (JSON from Rust);
    NULL when no replica was picked."""
    key_id: str | None = None
    user_id: str | None = None
    project_id: str | None = None
    team_id: str | None = None
    org_id: str | None = None
    """The tenancy path at the time of the request (None without authentication)."""
    request_body: msgspec.Raw = msgspec.field(default_factory=_null)
    response_body: bytes | None = None
    """Kept only when the project keeps bodies and the request did not say no_store
    (request_body NULL and response_body None otherwise)."""


class UsageRow(UsageRecord, array_like=True, gc=False):
    """A UsageRecord sent as a JSON array of its fields, in their order: how gateways send
    their finals (`UsageBatch.rows`). Without the names a record is 217 bytes instead of
    504, and it encodes in 0.37 µs instead of 0.61 and decodes in 0.71 instead of 1.0."""


class UsageOpen(msgspec.Struct, kw_only=True, gc=False):
    """A request forwarded to a replica and not finished yet: sent with the next post once it
    has run a few tens of milliseconds, so that a gateway killed mid-request leaves a row the
    control plane settles (status `interrupted`)."""

    request_id: str
    model: str
    started_at: Instant
    prompt_estimate: Tally
    key_id: str | None = None
    user_id: str | None = None
    project_id: str | None = None
    team_id: str | None = None
    org_id: str | None = None

    def usage_open(self) -> UsageOpen:
        """Itself: what `UsageSink.open` takes may also build its open only when sent."""
        return self


class UsageBatch(msgspec.Struct, kw_only=True):
    """What one gateway worker sends to POST /internal/v1/usage, every fraction of a second."""

    gateway_id: str
    """Random per worker start: the control plane settles a gateway's open requests once
    it has not heard from that id for a while."""
    opens: list[UsageOpen] = msgspec.field(default_factory=list)
    finals: list[UsageRecord] = msgspec.field(default_factory=list)
    """Finished requests as objects (what gateways before `rows` sent; still taken)."""
    rows: list[UsageRow] = msgspec.field(default_factory=list)
    """Finished requests as arrays: what a gateway sends. The control plane takes both."""
    key_last_used: dict[str, Instant] = msgspec.field(default_factory=dict)
    """Key id -> latest use seen in this batch (the keys' `last_used_at`)."""

    def ended(self) -> list[UsageRecord]:
        """Every finished request of the batch: its objects, then its rows."""
        return [*self.finals, *self.rows]


# -- limits: POST /internal/v1/leases (JSON) ------------------------------------------
#
# A gateway worker forwards a request only against units it holds: a request unit
# (one admission; rpm counts them) and, where a concurrency limit is set, a slot.
# It leases them from the control plane's authority in small numbers, so that the
# sum over every worker and process stays within each limit by construction.


Scope = Annotated[str, msgspec.Meta(pattern=r"^(key|project):[A-Za-z0-9_-]{1,64}$")]
"""What a limit applies to: `key:<key_id>` or `project:<project_id>`."""


class LeaseAsk(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One scope's part of a lease call: what the gateway wants, gives back and reports.

    What goes back is absolute per lease ("n of lease L will not be used"), not a delta,
    so a call repeated after a lost answer counts once.
    """

    scope: Scope
    """`key:<key_id>` or `project:<project_id>`."""
    limits: Limits
    """The scope's limits as the gateway's snapshot has them (the authority keeps the latest)."""
    units: Amount = 0
    """Request units wanted now (scopes with rpm)."""
    slots: Amount = 0
    """Concurrency slots wanted now (scopes with concurrency)."""
    tokens: Amount = 0
    """Tokens wanted now (scopes with tpm or a budget): the requests' estimates."""
    back: dict[int, Amount] = msgspec.field(default_factory=dict)
    """Earlier leases (of units or of tokens) -> how much of each will not be used (it expired,
    went idle, or its requests used less than their estimates)."""
    tokens_over: Amount = 0
    """Tokens used beyond what was leased (requests that used more than their estimates),
    since the last call: counted in the tpm window and the budget then. Not idempotent:
    a call repeated after a lost answer counts them twice (refusing early, never late)."""
    slots_held: Amount = 0
    """Slots this gateway holds for the scope before this call's grant (a count, so that a
    grant whose answer was lost cannot leak slots)."""


class LeaseRequest(msgspec.Struct, kw_only=True):
    """A gateway worker's lease call; also its heartbeat while it holds slots."""

    gateway_id: str
    asks: list[LeaseAsk] = msgspec.field(default_factory=list)


class LeaseGrant(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The authority's answer for one scope: all that was asked (or less), or a refusal."""

    scope: str
    lease: int = 0
    """The id of the units granted, for giving back the unused ones."""
    units: int = 0
    """Request units granted; usable until `ttl` seconds from the call."""
    tokens_lease: int = 0
    """The id of the tokens granted."""
    tokens: int = 0
    """Tokens granted; usable until `ttl` seconds from the call."""
    slots: int = 0
    """Slots granted; held until reported given back (or reclaimed when the gateway goes silent)."""
    ttl: float = 0.0
    denied: str | None = None
    """The limit that refused what was asked: rpm, tpm, concurrency or budget (nothing granted)."""
    retry_after: float | None = None
    """Seconds until that limit frees (for Retry-After)."""


class LeaseReply(msgspec.Struct, kw_only=True):
    """The answer to a LeaseRequest: one grant per ask, in the same order."""

    grants: list[LeaseGrant] = msgspec.field(default_factory=list)
    heartbeat: float = 1.0
    """Call again at least this often while holding slots, or they are reclaimed."""
    reclaim_after: float = 5.0
    """Seconds without a call after which the authority takes a gateway's slots back (and may
    grant them to others): a gateway that has not had an answer for that long no longer
    starts requests on the slots it holds."""
