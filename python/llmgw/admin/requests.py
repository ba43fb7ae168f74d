"""The request-record routes: one request's record, its kept bodies, and replaying it."""

from __future__ import annotations

import asyncio
import http.client
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from llmgw.store import audit
from llmgw.store.requests import NotKept, RequestBody, RequestView, kept_body, request_view

from .route import ApiError, Raw, Request, Route
from .usage import NameResolver

REPLAY_TIMEOUT_S = 300.0
"""A replay is answered whole (not streamed): allow for a long generation."""


class ReplayRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What to replay a kept request to."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    """The model to send it to (any model the gateway serves)."""


def _not_found(request_id: str) -> ApiError:
    return ApiError(
        404,
        "requests.not_found",
        f"no request {request_id[:80]!r} is recorded; check the id (the "
        "x-request-id the gateway answered with), or it is older than the "
        "request retention.",
        "id",
    )


async def _kept(req: Request) -> tuple[RequestBody, str | None]:
    """The kept bodies of the request named in the path, and its key id; 404 otherwise."""
    rid = req.path_params["id"]
    found, key_id = await kept_body(req.db, rid)
    if found is None:
        raise _not_found(rid)
    if isinstance(found, NotKept):
        raise ApiError(404, "requests.body_not_kept", found.reason + ".", "id")
    return found, key_id


def routes(names: NameResolver | None = None) -> list[Route]:
    """The request routes; `names` fills the project path (None: it stays empty)."""

    async def get_request(req: Request) -> RequestView:
        rid = req.path_params["id"]
        view = await request_view(req.db, rid)
        if view is None:
            raise _not_found(rid)
        if names is not None and view.project_id:
            view.path = (await names(req.db, [view.project_id])).get(view.project_id)
        return view

    return [
        Route(
            "GET",
            "/api/v1/requests/{id}",
            "What one request went through",
            get_request,
            description=(
                "Who made it (ids and project path), the model asked for and the "
                "upstream model, the replica and the router's decision, retries, "
                "timings, status and tokens. State open: not finished yet; "
                "interrupted: its gateway died, tokens are the prompt estimate."
            ),
            response=RequestView,
        ),
        Route(
            "GET",
            "/api/v1/requests/{id}/body",
            "A kept request and its answer",
            get_body,
            description=(
                "Kept only where the key's project keeps bodies and the request did "
                "not say no_store; otherwise 404 requests.body_not_kept says why."
            ),
            response=RequestBody,
        ),
        Route(
            "POST",
            "/api/v1/requests/{id}/replay",
            "Send a kept request again, to any model",
            replay,
            request=ReplayRequest,
            response=dict[str, Any],
            description=(
                "Sends the kept request, with `model` replaced and not streamed, "
                "through the gateway (`gateway_url` in server.yaml), attributed to "
                "the original key; answers with the gateway's status and body."
            ),
        ),
    ]


async def get_body(req: Request) -> RequestBody:
    """GET /api/v1/requests/{id}/body."""
    return (await _kept(req))[0]


def _path_of(body: dict[str, Any]) -> str:
    # The record does not keep the path the client called; the body says which API it was.
    if "messages" in body:
        return "/v1/chat/completions"
    if "input" in body:
        return "/v1/embeddings"
    return "/v1/completions"


async def replay(req: Request) -> Raw:
    """POST /api/v1/requests/{id}/replay."""
    rid = req.path_params["id"]
    base = getattr(req.state.settings, "gateway_url", None)
    if not base:
        raise ApiError(
            409,
            "requests.no_gateway",
            "the control plane does not know where the gateway is, so it cannot "
            "replay; set gateway_url in server.yaml (e.g. http://127.0.0.1:8080) "
            "and restart it",
        )
    kept, key_id = await _kept(req)  # one read of the record: the body and the key
    try:
        body = msgspec.json.decode(kept.request)
    except msgspec.DecodeError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(
            409,
            "requests.not_replayable",
            f"the kept body of request {rid} is not a JSON object, so it cannot be sent again",
            "id",
        )
    body["model"] = req.body.model
    body["stream"] = False  # the answer is relayed whole
    body.pop("stream_options", None)
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer {req.state.gateway_token}",
        "x-llmgw-replay-of": rid,
    }
    if key_id:
        # The gateway attributes the replay to this key (it has no store to look it up).
        headers["x-llmgw-replay-key"] = key_id
    try:
        status, ctype, data, again = await asyncio.to_thread(
            post, str(base), _path_of(body), msgspec.json.encode(body), headers, REPLAY_TIMEOUT_S
        )
    except (OSError, http.client.HTTPException) as e:
        raise ApiError(
            502,
            "requests.gateway_unreachable",
            f"the gateway at {base} did not answer the replay ({e}); check that it "
            "runs and that gateway_url in server.yaml points at it",
        ) from None
    # A replay runs as the original key and counts in its usage and budget: who sent it,
    # to which model and with what outcome is kept like any change made here.
    await audit.record(req.db, req.actor, "request.replay", f"request:{rid}", None,
                       {"model": req.body.model, "key_id": key_id, "status": status, "request_id": again})
    if status == 401:
        # The gateway's 401 is about the replayed key, not the caller's admin token (which
        # a 401 from here would mean): answered as a conflict, in the gateway's words.
        raise ApiError(409, "requests.replay_refused",
                       f"the gateway refused the replay: {_message(data)}", "id")
    return Raw(data, ctype or "application/json", status)


def _message(data: bytes) -> str:
    """The message of an OpenAI-shaped error body, or the start of the body."""
    try:
        return str(msgspec.json.decode(data)["error"]["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace")


def post(
    base: str, path: str, payload: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, str, bytes, str | None]:
    """POSTs `payload` to `base` + `path` (blocking: run it in a thread); (status, type, body,
    the answer's x-request-id)."""
    u = urlsplit(base)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    prefix = u.path.rstrip("/").removesuffix("/v1")  # gateway_url may end in /v1
    try:
        conn.request("POST", prefix + path, body=payload, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read(), resp.getheader("x-request-id")
    finally:
        conn.close()


ROUTES: list[Route] = routes()
"""Without project paths; the control plane mounts `routes(names=...)` instead."""
