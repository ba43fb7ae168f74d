"""The routes gateways call with the gateway token: snapshot long-poll, usage batches, limit leases, wake.

Their handlers only reach the control plane's state through `req.state`:
`snapshots` (`llmgw.control.snapshots.SnapshotPublisher`), `limits`
(`llmgw.control.limits.LimitsAuthority`), `ingest_usage(post)` (the usage store; a `store.usage_post.Post`)
and `wake(model)` (scale from zero; absent where the control plane places nothing).
"""

from __future__ import annotations

from llmgw.protocol.wire import (
    LeaseReply,
    LeaseRequest,
    Snapshot,
    UsageBatch,
    WakeReply,
    WakeRequest,
)
from llmgw.store.usage_post import Post, from_batch, from_json

from .route import ApiError, Param, Raw, Request, Route
from .store_errors import mapped

JSON = "application/json"


async def snapshot(req: Request) -> Raw:
    """Long-poll for the snapshot whose version is not `after`."""
    raw = req.query.get("after")
    after: int | None = None
    if raw is not None and raw != "":
        try:
            after = int(raw)
        except ValueError:
            raise ApiError(400, "internal.bad_after",
                           f"after must be a snapshot version (an integer), not {raw[:40]!r}", "after") from None
    body = await req.state.snapshots.wait(after)
    if body is None:
        raise ApiError(503, "internal.snapshot_not_ready",
                       "the control plane has not built its first snapshot yet; the gateway retries by itself")
    return Raw(body, JSON)


async def usage(req: Request) -> None:
    """Takes one batch of usage from a gateway worker."""
    ingest = getattr(req.state, "ingest_usage", None)
    if ingest is None:
        raise ApiError(503, "internal.usage_not_ready",
                       "this control plane does not take usage yet; the gateway keeps the batch and retries")
    # Read natively by the route's reader (`usage_post.from_json`: a Post), or decoded by
    # msgspec where it declined: kept bodies, old gateways' objects, text to clean.
    body: Post | UsageBatch = req.body
    if isinstance(body, UsageBatch):
        # Cleaning looks at every text field of every record (11 per final): skipped when
        # the body cannot hold what it replaces.
        body = from_batch(body if req.text_clean else clean_batch(body))
    await ingest(body)


_TEXT_FIELDS = ("request_id", "model", "upstream_model", "replica", "status", "finish_reason",
                "key_id", "user_id", "project_id", "team_id", "org_id")


def _clean(s: str) -> str:
    # What a client sent (a model name, a request id) can reach these fields; a NUL or
    # a lone surrogate cannot be stored as text, and refusing the batch would lose every
    # other record in it. Replaced instead: accounting goes on with a readable mark.
    if s.isascii():
        return s.replace("\x00", "\ufffd") if "\x00" in s else s
    return s.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def clean_batch(batch: UsageBatch) -> UsageBatch:
    """The batch with every text field storable (no NUL, no lone surrogate)."""
    for rec in (*batch.opens, *batch.ended()):
        for name in _TEXT_FIELDS:
            value = getattr(rec, name, None)
            if isinstance(value, str):
                fixed = _clean(value)
                if fixed is not value:
                    setattr(rec, name, fixed)
    batch.gateway_id = _clean(batch.gateway_id)
    batch.key_last_used = {_clean(k): v for k, v in batch.key_last_used.items()}
    return batch


async def leases(req: Request) -> LeaseReply:
    """Grants, takes back and reports limit units for one gateway worker."""
    ask: LeaseRequest = req.body  # decoded into the route's type by the app
    reply: LeaseReply = await req.state.limits.lease(ask)
    return reply


@mapped
async def wake(req: Request) -> WakeReply:
    """Scale from zero: a gateway holds requests for a model with no ready replica.

    `req.state.wake(model)` (the reconciler's) wants at least one replica of the model
    and returns a WakeReply (None reads as one replica wanted), or raises the store's
    NotFound or Invalid when the model is unknown or does not scale from zero (`mapped`
    answers them 404 or 400 with their code). The gateway then waits for a snapshot that
    lists a replica of it; many gateways asking for one model ask for the same replica.
    """
    ask: WakeRequest = req.body  # decoded into the route's type by the app
    waker = getattr(req.state, "wake", None)
    if waker is None:
        raise ApiError(404, "fleet.no_placement",
                       f"this control plane places no replicas, so it cannot start one of model "
                       f"{_clean(ask.model[:80])!r}; serve the model from an endpoint in the gateway's "
                       "configuration, or declare it in the catalog of a control plane that places",
                       "model")
    reply = await waker(ask.model)
    return reply if isinstance(reply, WakeReply) else WakeReply(model=ask.model)


ROUTES: list[Route] = [
    Route("GET", "/internal/v1/snapshot", "Long-poll for the gateways' snapshot of keys and limits", snapshot,
          description="Answers at once when the current version is not `after`, else waits up to 20 s "
                      "for a change and answers the same version.",
          query=(Param("after", "The version the gateway holds", "integer"),),
          response=Snapshot, internal=True),
    Route("POST", "/internal/v1/usage", "A gateway worker's batch of usage records", usage,
          description="Opens (requests forwarded, not finished), finals and the keys' last use; "
                      "idempotent per request id.",
          request=UsageBatch, read=from_json, status=204, internal=True),
    Route("POST", "/internal/v1/leases", "Lease, give back and report limit units", leases,
          description="Request units and concurrency slots so that limits hold across every gateway.",
          request=LeaseRequest, response=LeaseReply, internal=True),
    Route("POST", "/internal/v1/wake", "Start a replica of a model that has none ready", wake,
          description="Scale from zero: the control plane wants at least one replica of the model; the "
                      "gateway waits for a snapshot that lists one. Idempotent: asking again while one "
                      "is starting starts no second one.",
          request=WakeRequest, response=WakeReply, internal=True),
]
