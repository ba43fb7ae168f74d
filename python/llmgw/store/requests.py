"""Request records as the admin API shows them: what one request went through, and its bodies."""

from __future__ import annotations

from typing import Literal

import msgspec

from llmgw.protocol.wire import NULL, UsageRecord

from .db import Database
from .usage_rows import find_open, stored_final

State = Literal["open", "final", "interrupted"]


class RequestView(msgspec.Struct, kw_only=True):
    """One request: who made it, where it went, how long it took, what it used."""

    id: str
    state: State
    """open (still running, or its gateway has not been settled yet; tokens are the prompt
    estimate), final, or interrupted (its gateway died; tokens are the prompt estimate)."""
    gateway_id: str
    org_id: str | None
    team_id: str | None
    project_id: str | None
    user_id: str | None
    key_id: str | None
    path: str | None = None
    """`org/team/project` of the project, filled by the admin API when it still exists."""
    model: str
    """The name the client asked for."""
    upstream_model: str | None
    replica: str | None
    route: msgspec.Raw | None
    """The router's decision as the gateway recorded it (policy, prefix match, scores)."""
    retries: int
    stream: bool
    started_at: float
    ttft_ms: float | None
    duration_ms: float | None
    status: str | None
    http_status: int | None
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    usage_estimated: bool
    finish_reason: str | None
    body_kept: bool


class RequestBody(msgspec.Struct, kw_only=True):
    """The kept bodies of one request."""

    request: msgspec.Raw
    """The JSON the client sent, as sent."""
    response: str
    """The answer as the client received it (SSE frames for a stream)."""


class NotKept(msgspec.Struct, kw_only=True):
    """Why a request has no body to show."""

    reason: str


class _Record(msgspec.Struct, kw_only=True):
    """A request not stored as a posted final (a `requests` row, or an open), with the
    fields of wire.UsageRecord that a view shows, so that one function makes every view.
    Fields a request has not reached are empty: the defaults are what an open lacks."""

    request_id: str
    model: str
    started_at: float
    org_id: str | None
    team_id: str | None
    project_id: str | None
    user_id: str | None
    key_id: str | None
    prompt_tokens: int
    upstream_model: str | None = None
    replica: str | None = None
    route: msgspec.Raw | None = None
    retries: int = 0
    stream: bool = False
    ttft_ms: float | None = None
    duration_ms: float | None = None
    status: str | None = None
    http_status: int | None = None
    completion_tokens: int = 0
    usage_estimated: bool = True
    finish_reason: str | None = None


async def request_view(db: Database, request_id: str) -> RequestView | None:
    """The request's record, or None when there is none (never made, or past retention)."""
    found = await stored_final(db, request_id)
    if found is not None:
        gateway_id, rec = found
        kept = await db.fetchval("SELECT 1 FROM request_bodies WHERE request_id = $1", request_id)
        return _view(rec, "final", gateway_id, kept is not None)
    r = await db.fetchrow(
        "SELECT id, state, gateway_id, org_id, team_id, project_id, user_id, key_id, model, "
        "upstream_model, replica, route, retries, stream, started_at, ttft_ms, duration_ms, status, "
        "http_status, prompt_tokens, completion_tokens, usage_estimated, finish_reason, body_kept "
        "FROM requests WHERE id = $1",
        request_id,
    )
    if r is None:
        return await _open_view(db, request_id)
    # stream, usage_estimated and body_kept are INTEGER columns (0 or 1) on both backends.
    stored = _Record(
        request_id=r["id"],
        model=r["model"],
        started_at=r["started_at"],
        org_id=r["org_id"],
        team_id=r["team_id"],
        project_id=r["project_id"],
        user_id=r["user_id"],
        key_id=r["key_id"],
        prompt_tokens=int(r["prompt_tokens"]),
        upstream_model=r["upstream_model"],
        replica=r["replica"],
        route=None if r["route"] is None else msgspec.Raw(r["route"].encode()),
        retries=int(r["retries"]),
        stream=bool(r["stream"]),
        ttft_ms=r["ttft_ms"],
        duration_ms=r["duration_ms"],
        status=r["status"],
        http_status=None if r["http_status"] is None else int(r["http_status"]),
        completion_tokens=int(r["completion_tokens"]),
        usage_estimated=bool(r["usage_estimated"]),
        finish_reason=r["finish_reason"],
    )
    return _view(stored, r["state"], r["gateway_id"], bool(r["body_kept"]))


async def _open_view(db: Database, request_id: str) -> RequestView | None:
    found = await find_open(db, request_id)
    if found is None:
        return None
    gateway_id, o = found
    # Only its start is known: the rest keeps _Record's defaults, tokens the prompt estimate.
    started = _Record(
        request_id=o.request_id,
        model=o.model,
        started_at=o.started_at,
        org_id=o.org_id,
        team_id=o.team_id,
        project_id=o.project_id,
        user_id=o.user_id,
        key_id=o.key_id,
        prompt_tokens=o.prompt_estimate,
    )
    return _view(started, "open", gateway_id, False)


def _view(rec: UsageRecord | _Record, state: State, gateway_id: str, body_kept: bool) -> RequestView:
    """The view of a request: the one place its fields are set, whatever record it came from."""
    return RequestView(
        id=rec.request_id,
        state=state,
        gateway_id=gateway_id,
        org_id=rec.org_id,
        team_id=rec.team_id,
        project_id=rec.project_id,
        user_id=rec.user_id,
        key_id=rec.key_id,
        model=rec.model,
        upstream_model=rec.upstream_model,
        replica=rec.replica,
        route=None if rec.route == NULL else rec.route,  # a posted final says "no route" with NULL
        retries=rec.retries,
        stream=rec.stream,
        started_at=rec.started_at,
        ttft_ms=rec.ttft_ms,
        duration_ms=rec.duration_ms,
        status=rec.status,
        http_status=rec.http_status,
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        total_tokens=rec.prompt_tokens + rec.completion_tokens,
        usage_estimated=rec.usage_estimated,
        finish_reason=rec.finish_reason,
        body_kept=body_kept,
    )


async def request_body(db: Database, request_id: str) -> RequestBody | NotKept | None:
    """The kept bodies; NotKept with the reason when there are none; None for no such request."""
    return (await kept_body(db, request_id))[0]


async def kept_body(db: Database, request_id: str) -> tuple[RequestBody | NotKept | None, str | None]:
    """What `request_body` answers, and the key the request was made with (None: without
    one, or no finished record): a replay needs both."""
    if await db.fetchval("SELECT 1 FROM request_ids WHERE id = $1", request_id) is not None:
        b = await db.fetchrow("SELECT request, response FROM request_bodies WHERE request_id = $1", request_id)
        if b is not None and b["request"] is not None:
            found = await stored_final(db, request_id)  # its batch is decoded only for the key
            body = RequestBody(request=msgspec.Raw(b["request"].encode()), response=b["response"] or "")
            return body, None if found is None else found[1].key_id
        state = "final"
    else:
        r = await db.fetchrow(
            "SELECT r.state, r.key_id, b.request, b.response FROM requests r "
            "LEFT JOIN request_bodies b ON b.request_id = r.id WHERE r.id = $1",
            request_id,
        )
        if r is None:
            if await find_open(db, request_id) is None:
                return None, None
            return NotKept(reason=f"request {request_id} has no body kept: it has not finished yet "
                           "(bodies arrive with the final record)"), None
        if r["request"] is not None:
            return RequestBody(request=msgspec.Raw(r["request"].encode()), response=r["response"] or ""), r["key_id"]
        state = r["state"]
    if state == "interrupted":
        why = "its gateway stopped before the request finished, so no body reached the control plane"
    else:
        # The gateway sends bodies only when the key's project keeps them and the request
        # did not say no_store; the record does not say which of the two held.
        why = (
            "its project did not keep bodies when it ran, or the request asked not to be "
            "stored (no_store); set keep_bodies on the project to keep the next ones"
        )
    return NotKept(reason=f"request {request_id} has no body kept: {why}"), None
