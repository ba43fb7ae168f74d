"""The tenancy, keys and audit handlers called with hand-made requests: statuses and the
error bodies operators read (pinned), on both backends."""

from __future__ import annotations

from typing import Any

from inline_snapshot import snapshot

from llmgw.store import Database
from tests.support.admin_routes import Settings, State, call
from tests.support.store import with_db


async def _tree(db: Database) -> None:
    assert (await call(db, "POST", "/api/v1/orgs", {"name": "acme", "max_key_ttl": "30d"}))[
        0
    ] == 201
    assert (await call(db, "POST", "/api/v1/orgs", {"name": "beta"}))[0] == 201
    for org in ("acme", "beta"):
        assert (await call(db, "POST", "/api/v1/teams", {"org": org, "name": "ml"}))[0] == 201
    assert (
        await call(
            db,
            "POST",
            "/api/v1/projects",
            {"team": "acme/ml", "name": "chat", "limits": {"rpm": 60}},
        )
    )[0] == 201


def test_tree_through_handlers(store_url: str) -> None:
    async def body(db: Database) -> None:
        await _tree(db)
        status, orgs = await call(db, "GET", "/api/v1/orgs")
        assert status == 200
        assert [(o["name"], o["teams"], o["max_key_ttl"]) for o in orgs] == [
            ("acme", 1, 2592000.0),
            ("beta", 1, None),
        ]
        status, team = await call(db, "GET", "/api/v1/teams/acme:ml")
        assert (status, team["path"]) == (200, "acme/ml")
        assert (await call(db, "GET", f"/api/v1/teams/{team['id']}"))[1] == team
        status, proj = await call(db, "GET", "/api/v1/projects/acme:ml:chat")
        assert (status, proj["limits"], proj["keep_bodies"]) == (200, {"rpm": 60}, False)
        status, proj = await call(
            db,
            "PATCH",
            "/api/v1/projects/acme:ml:chat",
            {"keep_bodies": True, "max_key_ttl": None, "limits": None},
        )
        assert (status, proj["limits"], proj["keep_bodies"]) == (200, {}, True)
        status, teams = await call(db, "GET", "/api/v1/teams", query={"org": "beta"})
        assert [t["path"] for t in teams] == ["beta/ml"]
        status, projects = await call(db, "GET", "/api/v1/projects", query={"team": "acme/ml"})
        assert [p["path"] for p in projects] == ["acme/ml/chat"]
        status, org = await call(
            db, "PATCH", "/api/v1/orgs/beta", {"name": "gamma", "max_key_ttl": "90d"}
        )
        assert (status, org["name"], org["max_key_ttl"]) == (200, "gamma", 7776000.0)
        status, moved = await call(
            db, "PATCH", "/api/v1/projects/acme:ml:chat", {"team": "gamma/ml"}
        )
        assert (status, moved["path"]) == (200, "gamma/ml/chat")
        assert (await call(db, "DELETE", "/api/v1/teams/acme:ml"))[0] == 200
        status, gone = await call(db, "DELETE", "/api/v1/orgs/acme")
        assert (status, gone["name"]) == (200, "acme")
        assert (
            await call(db, "POST", "/api/v1/users", {"name": "alice", "email": "a@example.com"})
        )[0] == 201
        status, member = await call(
            db,
            "POST",
            "/api/v1/members",
            {"user": "alice", "scope": "team:gamma/ml", "role": "admin"},
        )
        assert (status, member["scope"], member["role"]) == (201, "team:gamma/ml", "admin")
        status, members = await call(db, "GET", "/api/v1/members", query={"scope": "team:gamma/ml"})
        assert [(m["user"], m["role"]) for m in members] == [("alice", "admin")]
        status, removed = await call(
            db, "DELETE", "/api/v1/members/alice", query={"scope": "team:gamma/ml"}
        )
        assert (status, removed["user"]) == (200, "alice")
        assert (await call(db, "PATCH", "/api/v1/users/alice", {"name": "alicia"}))[0] == 200
        assert (await call(db, "DELETE", "/api/v1/users/alicia"))[0] == 200
        assert (await call(db, "GET", "/api/v1/users"))[1] == []

    with_db(store_url, body)


def test_error_answers(store_url: str) -> None:
    async def body(db: Database) -> dict[str, Any]:
        await _tree(db)
        out: dict[str, Any] = {}

        async def err(label: str, method: str, path: str, body: Any = None, **kw: Any) -> None:
            status, answer = await call(db, method, path, body, **kw)
            out[label] = (status, answer["error"]["code"], answer["error"]["message"])

        await err("bad name in path", "GET", "/api/v1/orgs/..%2e")
        await err("upper case", "GET", "/api/v1/orgs/Acme")
        await err("id-shaped name", "PATCH", "/api/v1/orgs/acme", {"name": "org_abcdefghijklmnop"})
        await err("dots", "POST", "/api/v1/orgs", {"name": "a..b"})
        await err("team path too short", "GET", "/api/v1/teams/acme")
        await err("missing org", "GET", "/api/v1/orgs/nope")
        await err("missing team", "GET", "/api/v1/teams/acme:nope")
        await err("duplicate", "POST", "/api/v1/orgs", {"name": "acme"})
        await err("not empty", "DELETE", "/api/v1/orgs/acme")
        await err("move to taken", "PATCH", "/api/v1/teams/acme:ml", {"org": "beta"})
        await err("move to missing", "PATCH", "/api/v1/projects/acme:ml:chat", {"team": "nope/ml"})
        await err("bad scope", "GET", "/api/v1/members", query={"scope": "galaxy:acme"})
        await err(
            "missing user",
            "POST",
            "/api/v1/members",
            {"user": "nobody", "scope": "org:acme", "role": "owner"},
        )
        await call(db, "POST", "/api/v1/users", {"name": "alice"})
        await err("no scope", "DELETE", "/api/v1/members/alice")
        await err("not a member", "DELETE", "/api/v1/members/alice", query={"scope": "org:acme"})
        await err("bad email", "PATCH", "/api/v1/users/alice", {"email": "alice at example"})
        await err("zero ttl", "PATCH", "/api/v1/orgs/acme", {"max_key_ttl": "0d"})
        return out

    assert with_db(store_url, body) == snapshot(
        {
            "bad name in path": (
                400,
                "tenancy.bad_name",
                "'..%2e' is not a valid organization name: a name is 1 to 63 lowercase letters, "
                "digits, '.', '_' or '-', starting and ending with a letter or digit, without "
                "'..'; pick another, like 'ml-research'",
            ),
            "upper case": (
                400,
                "tenancy.bad_name",
                "'Acme' is not a valid organization name: a name is 1 to 63 lowercase letters, "
                "digits, '.', '_' or '-', starting and ending with a letter or digit, without "
                "'..'; pick another, like 'ml-research'",
            ),
            "id-shaped name": (
                400,
                "tenancy.bad_name",
                "'org_abcdefghijklmnop' is not a valid organization name: a name is 1 to 63 "
                "lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or "
                "digit, without '..' and not shaped like an ID; pick another, like 'ml-research'",
            ),
            "dots": (
                400,
                "tenancy.bad_name",
                "'a..b' is not a valid organization name: a name is 1 to 63 lowercase letters, "
                "digits, '.', '_' or '-', starting and ending with a letter or digit, without "
                "'..'; pick another, like 'ml-research'",
            ),
            "team path too short": (
                400,
                "tenancy.bad_reference",
                "'acme' does not name a team: give its ID or its path, like 'acme/ml'",
            ),
            "missing org": (
                404,
                "tenancy.not_found",
                "there is no organization 'nope'; list them with `llmgw ctl orgs list`",
            ),
            "missing team": (
                404,
                "tenancy.not_found",
                "there is no team 'acme/nope'; list them with `llmgw ctl teams list`",
            ),
            "duplicate": (
                409,
                "tenancy.name_taken",
                "an organization named 'acme' already exists; pick another name",
            ),
            "not empty": (
                409,
                "tenancy.not_empty",
                "organization 'acme' still has 1 team(s) (ml); delete or move them first",
            ),
            "move to taken": (
                409,
                "tenancy.name_taken",
                "organization 'beta' already has a team named 'ml'; rename one of the two first",
            ),
            "move to missing": (
                404,
                "tenancy.not_found",
                "there is no team 'nope/ml'; list them with `llmgw ctl teams list`",
            ),
            "bad scope": (
                400,
                "tenancy.bad_scope",
                "'galaxy:acme' is not a scope; write org:ORG, team:ORG/TEAM, "
                "project:ORG/TEAM/PROJECT or an org, team or project ID",
            ),
            "missing user": (
                404,
                "users.not_found",
                "there is no user 'nobody'; list them with `llmgw ctl users list`",
            ),
            "no scope": (
                400,
                "members.scope_required",
                "say which membership to remove with ?scope=org:ORG, team:ORG/TEAM or project:ORG/TEAM/PROJECT",
            ),
            "not a member": (
                404,
                "members.not_found",
                "user 'alice' is not a member at org:acme; list that scope's members with "
                "`llmgw ctl members list --in acme`",
            ),
            "bad email": (
                400,
                "request.bad_body",
                "Expected `str` matching regex "
                "'^[^@\\\\s\\\\x00-\\\\x1f\\\\x7f]{1,64}@[^@\\\\s\\\\x00-\\\\x1f\\\\x7f]{1,190}$' "
                "- at `$.email`",
            ),
            "zero ttl": (
                400,
                "tenancy.bad_ttl",
                "'0d' is zero; give a duration longer than that, like 1h",
            ),
        }
    )


def test_keys_through_handlers(store_url: str) -> None:
    async def body(db: Database) -> dict[str, Any]:
        await _tree(db)
        await call(db, "POST", "/api/v1/users", {"name": "alice"})
        state = State(Settings(max_key_ttl=7 * 86400.0))
        status, issued = await call(
            db,
            "POST",
            "/api/v1/keys",
            {"project": "acme/ml/chat", "name": "ci", "ttl": "1d"},
            state=state,
        )
        assert status == 201 and issued["key"].startswith("sk-llmgw-")
        assert issued["expires_at"] - issued["created_at"] == 86400.0
        status, default = await call(
            db, "POST", "/api/v1/keys", {"project": "acme/ml/chat", "name": "ci2"}, state=state
        )
        assert default["expires_at"] - default["created_at"] == 7 * 86400.0
        status, listed = await call(db, "GET", "/api/v1/keys", query={"project": "acme/ml/chat"})
        assert status == 200 and {k["id"] for k in listed} == {issued["id"], default["id"]}
        assert all("key" not in k and "hash" not in k for k in listed)
        status, got = await call(db, "GET", f"/api/v1/keys/{issued['id']}")
        assert got == {k: v for k, v in issued.items() if k != "key"}
        status, patched = await call(
            db, "PATCH", f"/api/v1/keys/{issued['id']}", {"limits": {"rpm": 1}}
        )
        assert (status, patched["limits"]) == (200, {"rpm": 1})
        for _ in range(2):
            status, revoked = await call(db, "POST", f"/api/v1/keys/{issued['id']}/revoke")
            assert status == 200 and revoked["revoked_at"] is not None
        status, listed = await call(db, "GET", "/api/v1/keys", query={"revoked": "false"})
        assert [k["id"] for k in listed] == [default["id"]]
        status, events = await call(
            db, "GET", "/api/v1/audit", query={"contains": "key.", "limit": "2"}
        )
        assert [e["action"] for e in events] == ["key.revoke", "key.update"]
        assert issued["key"] not in repr(events)

        out: dict[str, Any] = {}

        async def err(label: str, method: str, path: str, body: Any = None, **kw: Any) -> None:
            kw.setdefault("state", state)
            status, answer = await call(db, method, path, body, **kw)
            out[label] = (status, answer["error"]["code"], answer["error"]["message"])

        await err(
            "ttl above gateway",
            "POST",
            "/api/v1/keys",
            {"project": "acme/ml/chat", "name": "x", "ttl": "8d"},
        )
        await err(
            "ttl above org",
            "POST",
            "/api/v1/keys",
            {"project": "acme/ml/chat", "name": "x", "ttl": "31d"},
            state=State(Settings(max_key_ttl=None)),
        )
        await err(
            "not a member",
            "POST",
            "/api/v1/keys",
            {"project": "acme/ml/chat", "name": "x", "user": "alice"},
        )
        await err(
            "missing project", "POST", "/api/v1/keys", {"project": "acme/ml/nope", "name": "x"}
        )
        await err("missing key", "GET", "/api/v1/keys/key_aaaaaaaaaaaaaaaa")
        await err("sql key id", "POST", "/api/v1/keys/x' OR '1'='1/revoke")
        await err("key in url", "GET", "/api/v1/keys", query={"project": issued["key"]})
        await err("key as id", "GET", f"/api/v1/keys/{issued['key']}")
        await err("bad revoked flag", "GET", "/api/v1/keys", query={"revoked": "maybe"})
        await err("audit bad limit", "GET", "/api/v1/audit", query={"limit": "0"})
        await err("audit bad since", "GET", "/api/v1/audit", query={"since": "1 OR 1=1"})
        return {k: (s, c, m.replace(issued["key"], "<key>")) for k, (s, c, m) in out.items()}

    assert with_db(store_url, body) == snapshot(
        {
            "ttl above gateway": (
                400,
                "keys.ttl_too_long",
                "a ttl of 8d is longer than the gateway's max_key_ttl allows (7d); ask for 7d or "
                "less, or leave ttl out to get the longest allowed",
            ),
            "ttl above org": (
                400,
                "keys.ttl_too_long",
                "a ttl of 31d is longer than the organization 'acme' allows (30d); ask for 30d or "
                "less, or leave ttl out to get the longest allowed",
            ),
            "not a member": (
                403,
                "keys.user_not_member",
                "user 'alice' is not a member of project 'acme/ml/chat' or of the team or org "
                "above it; add them first (llmgw ctl members add)",
            ),
            "missing project": (
                404,
                "tenancy.not_found",
                "there is no project 'acme/ml/nope'; list them with `llmgw ctl projects list`",
            ),
            "missing key": (
                404,
                "keys.not_found",
                "there is no key 'key_aaaaaaaaaaaaaaaa'; list them with `llmgw ctl keys list`",
            ),
            "sql key id": (
                404,
                "keys.not_found",
                "there is no key \"x' OR '1'='1\"; list them with `llmgw ctl keys list`",
            ),
            "key in url": (
                400,
                "keys.key_in_url",
                "project holds an API key; keys never go in URLs (they end up in logs): revoke "
                "this key, and name keys by their ID (key_...)",
            ),
            "key as id": (
                400,
                "keys.key_in_url",
                "id holds an API key; keys never go in URLs (they end up in logs): revoke this "
                "key, and name keys by their ID (key_...)",
            ),
            "bad revoked flag": (
                400,
                "request.bad_flag",
                "revoked='maybe' is not a boolean; write revoked=true or revoked=false",
            ),
            "audit bad limit": (
                400,
                "audit.bad_limit",
                "limit='0' is not a number from 1 to 1000; give one like limit=100",
            ),
            "audit bad since": (
                400,
                "audit.bad_time",
                "since='1 OR 1=1' is neither a duration back from now (90m, 24h, 7d) nor a date "
                "(2026-11-01) nor an RFC 3339 time (2026-11-01T08:00:00Z); give one of those",
            ),
        }
    )


def test_unknown_fields_are_refused(store_url: str) -> None:
    async def body(db: Database) -> None:
        status, answer = await call(db, "POST", "/api/v1/orgs", {"name": "acme", "owner": "x"})
        assert (status, answer["error"]["code"]) == (400, "request.bad_body")

    with_db(store_url, body)
