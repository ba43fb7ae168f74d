"""The usage and request handlers, called with a hand-made Request (the app is tested elsewhere)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from llmgw.admin import requests as req_routes
from llmgw.admin import usage as usage_routes
from llmgw.admin.route import ApiError, Raw, Request, Route
from llmgw.secrets.keys import derive
from llmgw.store import Database, audit, keys, tenancy
from llmgw.store.usage import ingest, settle_gateway
from tests.support.store import with_db
from tests.support.usage import T0, batch, final, opened

D = 86_400.0


def _route(routes: list[Route], method: str, path: str) -> Route:
    return next(r for r in routes if r.method == method and r.path == path)


def _req(
    db: Database,
    query: dict[str, str] | None = None,
    path_params: dict[str, str] | None = None,
    body: Any = None,
    gateway_url: str | None = None,
) -> Request:
    state = SimpleNamespace(
        settings=SimpleNamespace(gateway_url=gateway_url), gateway_token="gw-tok"
    )
    return Request(
        method="GET",
        path="/",
        path_params=path_params or {},
        query=query or {},
        body=body,
        actor="admin",
        db=db,
        state=state,
    )


async def _names(db: Database, ids: list[str]) -> dict[str, str]:
    return {"proj_a": "acme/ml/chat"}


def test_usage_by_scope_fills_paths_and_rejects_bad_input(store_url: str) -> None:
    async def body(db: Database) -> None:
        import time

        now = time.time()
        await ingest(
            db,
            batch(finals=[final("1", at=now - 60), final("2", at=now - 60, project="proj_x")]),
            now,
        )
        get = _route(usage_routes.routes(_names), "GET", "/api/v1/usage").handler
        rows = await get(_req(db, {"by": "project", "since": "2h"}))
        assert [(u.scope_id, u.path, u.requests) for u in rows] == [
            ("proj_a", "acme/ml/chat", 1),
            ("proj_x", None, 1),
        ]
        teams = await _route(usage_routes.ROUTES, "GET", "/api/v1/usage").handler(_req(db))
        assert [(u.scope_id, u.path, u.total_tokens) for u in teams] == [("team_a", None, 34)]
        for query, code in (
            ({"by": "region"}, "usage.bad_scope_kind"),
            ({"since": "0h"}, "usage.bad_since"),
            ({"since": "yesterday"}, "usage.bad_time"),
        ):
            with pytest.raises(ApiError) as e:
                await get(_req(db, query))
            assert (e.value.status, e.value.code) == (400, code)
        with pytest.raises(ApiError) as e:
            await get(_req(db, {"by": "region"}))
        assert e.value.message == (
            "by='region' is not one of org, team, project; give one of those (default team)"
        )

    with_db(store_url, body)


def test_export_csv_and_json(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(
            db,
            batch(
                finals=[
                    final("1", at=T0 + 10),
                    final("2", at=T0 + D + 10, model="x"),
                    final("3", at=T0 + D + 20, status="timeout"),
                ]
            ),
            T0,
        )
        get = _route(usage_routes.ROUTES, "GET", "/api/v1/usage/export").handler
        q = {"from": "2026-11-01", "to": "2026-11-02", "period": "day", "by": "model,project"}
        got = await get(_req(db, q))
        assert isinstance(got, Raw) and got.content_type == "text/csv; charset=utf-8"
        assert got.body.decode() == (
            "period_start,project_id,model,requests,errors,prompt_tokens,completion_tokens,"
            "project_path\n"  # proj_a is in no tenancy tree here: its path reads ''
            "2026-11-01T00:00:00Z,proj_a,m,1,0,12,5,\n"
            "2026-11-02T00:00:00Z,proj_a,m,1,1,12,5,\n"
            "2026-11-02T00:00:00Z,proj_a,x,1,0,12,5,\n"
        )
        js = await get(_req(db, {**q, "format": "json", "period": "month", "by": ""}))
        assert msgspec.json.decode(msgspec.json.encode(js)) == [
            {
                "period_start": T0,
                "requests": 3,
                "errors": 1,
                "prompt_tokens": 36,
                "completion_tokens": 15,
            }
        ]
        # to= a date includes that day; a time counts the whole hour holding it (hourly rollups)
        hours = await get(
            _req(
                db,
                {
                    "from": "2026-11-01T00:00:00Z",
                    "to": "2026-11-02T00:00:11+00:00",
                    "period": "hour",
                    "format": "json",
                },
            )
        )
        assert [r.requests for r in hours] == [1, 2]
        empty = await get(_req(db, {"from": "2026-10-01", "to": "2026-10-02"}))
        assert empty.body == b"period_start,requests,errors,prompt_tokens,completion_tokens\n"
        for query, code in (
            ({"period": "week"}, "usage.bad_period"),
            ({"by": "org,region"}, "usage.bad_dimension"),
            ({"format": "xml"}, "usage.bad_format"),
            ({"from": "11/01/2026"}, "usage.bad_time"),
            ({"from": "2026-11-02", "to": "2026-11-01"}, "usage.bad_range"),
        ):
            with pytest.raises(ApiError) as e:
                await get(_req(db, query))
            assert (e.value.status, e.value.code) == (400, code)

    with_db(store_url, body)


def test_export_rows_name_their_scopes_and_keys(store_url: str) -> None:
    # Beside each id its path or name; one that no longer exists reads '' (org_a and team_a
    # were never created here; the project and its key are, then deleted).
    async def body(db: Database) -> None:
        await tenancy.create_org(db, "admin", "acme")
        await tenancy.create_team(db, "admin", "acme", "ml")
        project = await tenancy.create_project(db, "admin", "acme/ml", "chat")
        issued = await keys.issue_key(db, "admin", project="acme/ml/chat", name="ci",
                                      hash_key=derive(b"s" * 32, "llmgw api-key hash v1"))
        await ingest(db, batch(finals=[final("1", at=T0 + 10, project=project.id,
                                             key=issued.id)]), T0)
        get = _route(usage_routes.ROUTES, "GET", "/api/v1/usage/export").handler
        q = {"from": "2026-11-01", "to": "2026-11-01", "by": "org,team,project,key"}
        got = await get(_req(db, q))
        pid, kid = project.id, issued.id
        assert got.body.decode() == (
            "period_start,org_id,team_id,project_id,key_id,requests,errors,prompt_tokens,"
            "completion_tokens,org_path,team_path,project_path,key_name\n"
            f"2026-11-01T00:00:00Z,org_a,team_a,{pid},{kid},1,0,12,5,,,acme/ml/chat,ci\n"
        )
        [row] = await get(_req(db, {**q, "format": "json"}))
        assert msgspec.to_builtins(row) == {
            "period_start": T0, "org_id": "org_a", "org_path": "", "team_id": "team_a",
            "team_path": "", "project_id": pid, "project_path": "acme/ml/chat", "key_id": kid,
            "key_name": "ci", "requests": 1, "errors": 0, "prompt_tokens": 12,
            "completion_tokens": 5,
        }
        [row] = await get(_req(db, {**q, "format": "json", "by": "model"}))
        assert "project_path" not in msgspec.to_builtins(row)  # only for chosen dimensions
        await keys.revoke_key(db, "admin", kid)
        await tenancy.delete_project(db, "admin", "acme/ml/chat")
        got = await get(_req(db, {**q, "by": "project,key"}))
        assert got.body.decode().splitlines()[1] == (
            f"2026-11-01T00:00:00Z,{pid},{kid},1,0,12,5,,"
        )

    with_db(store_url, body)


def test_request_record_and_body(store_url: str) -> None:
    async def body(db: Database) -> None:
        await ingest(db, batch(opens=[opened("o")], finals=[final("k", body=True), final("n")]), T0)
        routes = req_routes.routes(_names)
        get = _route(routes, "GET", "/api/v1/requests/{id}").handler
        view = await get(_req(db, path_params={"id": "k"}))
        doc = msgspec.json.decode(msgspec.json.encode(view))
        assert (doc["path"], doc["state"], doc["route"], doc["total_tokens"], doc["body_kept"]) == (
            "acme/ml/chat",
            "final",
            {"policy": "prefix", "matched": 12},
            17,
            True,
        )
        assert (await get(_req(db, path_params={"id": "o"}))).state == "open"
        with pytest.raises(ApiError) as e:
            await get(_req(db, path_params={"id": "nope"}))
        assert (e.value.status, e.value.code) == (404, "requests.not_found")
        get_body = _route(routes, "GET", "/api/v1/requests/{id}/body").handler
        kept = msgspec.json.decode(
            msgspec.json.encode(await get_body(_req(db, path_params={"id": "k"})))
        )
        assert kept == {"request": {"model": "m", "messages": []}, "response": '{"choices":[]}'}
        with pytest.raises(ApiError) as e:
            await get_body(_req(db, path_params={"id": "n"}))
        assert (e.value.status, e.value.code) == (404, "requests.body_not_kept")
        assert e.value.message == (
            "request n has no body kept: its project did not keep bodies when it ran, or the "
            "request asked not to be stored (no_store); set keep_bodies on the project to keep "
            "the next ones."
        )

    with_db(store_url, body)


def test_request_record_in_each_state_field_by_field(store_url: str) -> None:
    # Every field of the record, as the API answers it, from each place a record comes from:
    # an open, a final as posted, an interrupted row, and a final row from before migration 0007.
    who = {"gateway_id": "gw1", "org_id": "org_a", "team_id": "team_a", "project_id": "proj_a",
           "user_id": "user_a", "key_id": "key_a", "path": "acme/ml/chat", "model": "m"}
    blank = {"upstream_model": None, "replica": None, "route": None, "retries": 0, "stream": False,
             "started_at": T0, "ttft_ms": None, "duration_ms": None, "status": None, "http_status": None}
    ended = {"upstream_model": "up-m", "replica": "r1", "route": {"policy": "prefix", "matched": 12},
             "retries": 2, "stream": True, "started_at": T0, "ttft_ms": 3.5, "duration_ms": 20.0,
             "status": "ok", "http_status": 200}
    want = {
        "o": {"id": "o", "state": "open", **who, **blank, "prompt_tokens": 10, "completion_tokens": 0,
              "total_tokens": 10, "usage_estimated": True, "finish_reason": None, "body_kept": False},
        "k": {"id": "k", "state": "final", **who, **ended, "prompt_tokens": 12, "completion_tokens": 5,
              "total_tokens": 17, "usage_estimated": False, "finish_reason": "stop", "body_kept": True},
        "i": {"id": "i", "state": "interrupted", **who, "gateway_id": "gw2", **blank,
              "status": "interrupted", "prompt_tokens": 40, "completion_tokens": 0, "total_tokens": 40,
              "usage_estimated": True, "finish_reason": None, "body_kept": False},
        "old": {"id": "old", "state": "final", **who, **ended, "prompt_tokens": 7, "completion_tokens": 4,
                "total_tokens": 11, "usage_estimated": False, "finish_reason": "length", "body_kept": True},
    }

    async def body(db: Database) -> None:
        k = msgspec.structs.replace(final("k", body=True), stream=True, retries=2)
        await ingest(db, batch(opens=[opened("o")], finals=[k]), T0)
        await ingest(db, batch("gw2", opens=[opened("i", estimate=40)]), T0)
        assert await settle_gateway(db, "gw2", T0 + 5) == 1
        await db.execute(
            "INSERT INTO requests (id, state, gateway_id, org_id, team_id, project_id, user_id, key_id, "
            "model, upstream_model, replica, route, retries, stream, started_at, ttft_ms, duration_ms, "
            "status, http_status, prompt_estimate, prompt_tokens, completion_tokens, usage_estimated, "
            "finish_reason, body_kept, updated_at) VALUES ('old', 'final', 'gw1', 'org_a', 'team_a', "
            "'proj_a', 'user_a', 'key_a', 'm', 'up-m', 'r1', '{\"policy\":\"prefix\",\"matched\":12}', "
            "2, 1, $1, 3.5, 20.0, 'ok', 200, 7, 7, 4, 0, 'length', 1, $1)",
            T0,
        )
        get = _route(req_routes.routes(_names), "GET", "/api/v1/requests/{id}").handler
        for rid, doc in want.items():
            raw = msgspec.json.encode(await get(_req(db, path_params={"id": rid})))
            assert msgspec.json.decode(raw) == doc
            # The same bytes: field order, and 200 not 200.0, true not 1.
            assert raw == msgspec.json.encode(doc)

    with_db(store_url, body)


def test_replay_goes_through_the_gateway(store_url: str) -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def gateway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {h.split(": ", 1)[0].lower(): h.split(": ", 1)[1] for h in head[1:] if h}
        data = await reader.readexactly(int(headers["content-length"]))
        seen.append((head[0], headers, data))
        answer = b'{"id":"chatcmpl-1","choices":[]}'
        status = b"200 OK"
        if b'"model":"gone"' in data:  # as a gateway answers a replay whose key was revoked
            answer = b'{"error":{"message":"the replayed request\'s key key_a is revoked"}}'
            status = b"401 Unauthorized"
        writer.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(answer)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + answer
        )
        await writer.drain()
        writer.close()

    async def body(db: Database) -> None:
        await ingest(db, batch(finals=[final("k", body=True), final("n")]), T0)
        replay = _route(req_routes.ROUTES, "POST", "/api/v1/requests/{id}/replay").handler
        with pytest.raises(ApiError) as e:
            await replay(
                _req(db, path_params={"id": "k"}, body=req_routes.ReplayRequest(model="big"))
            )
        assert (e.value.status, e.value.code) == (409, "requests.no_gateway")
        server = await asyncio.start_server(gateway, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            url = f"http://127.0.0.1:{port}/v1"
            got = await replay(
                _req(
                    db,
                    path_params={"id": "k"},
                    gateway_url=url,
                    body=req_routes.ReplayRequest(model="big"),
                )
            )
            with pytest.raises(ApiError) as e:
                await replay(
                    _req(
                        db,
                        path_params={"id": "n"},
                        gateway_url=url,
                        body=req_routes.ReplayRequest(model="big"),
                    )
                )
            assert e.value.code == "requests.body_not_kept"
            with pytest.raises(ApiError) as e:
                await replay(_req(db, path_params={"id": "k"}, gateway_url=url,
                                  body=req_routes.ReplayRequest(model="gone")))
            events = await audit.query(db, actor="admin")
            assert [(e.action, e.target, e.after["model"], e.after["status"]) for e in events] == [
                ("request.replay", "request:k", "gone", 401), ("request.replay", "request:k", "big", 200)]
            # Not a 401: that would tell the operator their admin token is wrong.
            assert (e.value.status, e.value.code, str(e.value)) == (
                409, "requests.replay_refused",
                "the gateway refused the replay: the replayed request's key key_a is revoked")
        assert isinstance(got, Raw) and (got.status, got.body) == (
            200,
            b'{"id":"chatcmpl-1","choices":[]}',
        )
        line, headers, sent = seen[0]
        assert line == "POST /v1/chat/completions HTTP/1.1"
        assert (
            headers["authorization"],
            headers["x-llmgw-replay-of"],
            headers["x-llmgw-replay-key"],
        ) == ("Bearer gw-tok", "k", "key_a")
        assert msgspec.json.decode(sent) == {"model": "big", "messages": [], "stream": False}
        with pytest.raises(ApiError) as e:  # nothing listens there any more
            await replay(
                _req(
                    db,
                    path_params={"id": "k"},
                    gateway_url=url,
                    body=req_routes.ReplayRequest(model="big"),
                )
            )
        assert (e.value.status, e.value.code) == (502, "requests.gateway_unreachable")

    with_db(store_url, body)
