"""`llmgw ctl` against a running control plane, and against a stand-in server that answers what
each test sets, to see exactly what a command sends and how it shows each kind of answer."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from inline_snapshot import snapshot

from llmgw.admin.matching import Router
from llmgw.admin.table import ROUTES
from llmgw.cli.ctl.commands import COMMANDS
from llmgw.cli.main import main
from tests.support.control_plane import Server
from tests.support.procs import refused_port, start_process


def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `llmgw ctl ARGV`."""
    try:
        code = main(["ctl", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_prints_the_servers_document(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ctl(capsys, "--server", server.url, "--data-dir", str(server.data_dir),
                       "api", "routes", "--json")
    assert code == 0 and json.loads(out)["openapi"] == "3.1.0"


def test_tables_for_people(server: Server, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", server.admin_token)
    monkeypatch.setenv("LLMGW_SERVER", server.url)
    assert ctl(capsys, "orgs", "create", "acme", "--rpm", "600")[0] == 0
    assert ctl(capsys, "teams", "create", "acme/ml")[0] == 0
    code, out, err = ctl(capsys, "teams", "list")
    out = re.sub(r"team_[a-z0-9]{16}", "team_ID", re.sub(r"\d{4}-\d\d-\d\dT[\d:]+Z", "TIME", out))
    assert (code, out, err) == snapshot((0, """\
ID                     PATH     MAX KEY TTL  LIMITS  CREATED
team_ID  acme/ml  -            -       TIME
""", ""))
    assert ctl(capsys, "orgs", "create", "../etc") == snapshot((2, "", (
        "error: ORG: '../etc' does not name a new organization: '..' is not a name (a name "
        "is 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a "
        "letter or digit, without '..'); give ORG, like acme\n")))


def test_a_noun_alone_lists(server: Server, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", server.admin_token)
    monkeypatch.setenv("LLMGW_SERVER", server.url)
    assert ctl(capsys, "orgs", "create", "acme")[0] == 0
    listed = ctl(capsys, "orgs", "list")
    assert listed[0] == 0 and "acme" in listed[1]
    assert ctl(capsys, "orgs") == listed  # `ctl orgs` is `ctl orgs list`
    assert ctl(capsys, "nodes", "--json") == ctl(capsys, "nodes", "list", "--json")
    code, _, err = ctl(capsys, "requests")  # nothing to list: a verb is asked for
    assert code == 2 and "VERB" in err


def test_values_against_a_pattern_are_refused_in_words(server: Server, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # msgspec's own words quote the regex; the operator is told the rule and what they sent.
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", server.admin_token)
    monkeypatch.setenv("LLMGW_SERVER", server.url)
    assert ctl(capsys, "orgs", "create", "acme")[0] == 0
    assert ctl(capsys, "orgs", "set", "acme", "--max-key-ttl", "5x") == snapshot((1, "", (
        "error: '5x' in `max_key_ttl` is not a valid duration: a duration is a number and a "
        "unit (ms, s, m, h, d, w), like 90m, 24h or 30d [admin.bad_duration]\n")))
    email = ctl(capsys, "users", "create", "ann", "--email", "ann at example.com")
    assert email == snapshot((1, "", (
        "error: 'ann at example.com' in `email` is not a valid email address: give one like "
        "alice@example.com [users.bad_email]\n")))
    # Other refusals keep msgspec's words, which name the type and the limit.
    assert ctl(capsys, "projects", "create", "acme/ml/chat", "--rpm", "0") == snapshot((1, "", (
        "error: the request body is invalid: Expected `int` >= 1 - at `$.limits.rpm`; GET "
        "/api/v1/openapi.json shows its schema [admin.invalid_body]\n")))


def test_audit_and_usage_take_since_as_a_duration_or_a_date(server: Server, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", server.admin_token)
    monkeypatch.setenv("LLMGW_SERVER", server.url)
    assert ctl(capsys, "orgs", "create", "acme")[0] == 0
    for since in ("1h", "2020-01-01", "2020-01-01T00:00:00Z"):
        code, out, _ = ctl(capsys, "audit", "--since", since)
        assert code == 0 and "org.create" in out, since
        assert ctl(capsys, "usage", "--since", since)[0] == 0
    assert ctl(capsys, "audit", "--since", "2999-01-01") == (0, "no audit\n", "")
    code, _, err = ctl(capsys, "audit", "--since", "yesterday")
    assert code == 1 and "neither a duration back from now (90m, 24h, 7d) nor a date" in err
    assert err.rstrip().endswith("[audit.bad_time]")


def test_unreachable_server_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with refused_port() as port:
        code, out, err = ctl(capsys, "--server", f"http://127.0.0.1:{port}", "--token", "t",
                             "orgs", "list")
    assert (code, out, err.replace(str(port), "PORT")) == snapshot((3, "", (
        "error: cannot reach the control plane at http://127.0.0.1:PORT (connection "
        "refused); start it with `llmgw server` on that machine (it listens on "
        "http://127.0.0.1:8081 by default), or point --server (or LLMGW_SERVER) at where it "
        "runs\n")))


def test_wrong_token_is_exit_4(server: Server, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "token"
    bad.write_text("llmgw-admin-not-this-one\n")
    code, out, err = ctl(capsys, "--server", server.url, "--token-file", str(bad), "api", "routes")
    err = err.replace(str(server.data_dir), "DATA").replace(str(tmp_path), "TMP")
    assert (code, out, err) == snapshot((4, "", (
        "error: the bearer token is not valid here: send `Authorization: Bearer <admin "
        "token>`; the admin token is in DATA/admin-token on the control plane's machine "
        "[auth.bad_token]\n"
        "hint: the token was read from --token-file TMP/token\n")))
    code, _, err = ctl(capsys, "--server", server.url, "--data-dir", str(tmp_path / "none"), "api", "routes")
    assert code == 4 and "no admin token" in err


def test_a_gateway_given_as_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    # The ports differ by one (8080, 8081): a real gateway answers /api/v1 with its 404.
    args = [sys.executable, "-m", "llmgw", "gateway", "--endpoint", "sim=http://127.0.0.1:9=sim-model",
            "--port", "0"]
    with start_process(args, "llmgw gateway listening on") as gateway:
        port = gateway.port
        code, out, err = ctl(capsys, "--server", gateway.url, "--token", "t", "orgs", "list")
    assert (code, out, err.replace(str(port), "PORT")) == snapshot((1, "", (
        "error: no route GET /api/v1/orgs; the OpenAI API is served under /v1 [not_found]\n"
        "hint: http://127.0.0.1:PORT answered like an OpenAI endpoint (a gateway?), not a "
        "control plane; point --server (or LLMGW_SERVER) at the admin API, "
        "http://127.0.0.1:8081 by default\n")))


def test_every_command_calls_a_mounted_route() -> None:
    # Every ctl command names a route of the admin table, and its path arguments fill
    # that route's {segments}; one (noun, verb) each.
    router = Router(ROUTES)
    seen = set()
    for c in COMMANDS:
        assert (c.noun, c.verb) not in seen
        seen.add((c.noun, c.verb))
        concrete = "/".join("x" if s.startswith("{") else s for s in c.path.split("/"))
        match = router.match(c.method, concrete)
        assert match is not None and match.route is not None and match.route.path == c.path
        route = match.route
        body_fields = {f.name for f in msgspec.structs.fields(route.request)} if route.request else set()
        for a in c.args:
            where = (c.noun, c.verb, a.flag)
            if a.to == "path":
                assert "{" + a.field + "}" in c.path, where
            elif a.to == "query":  # a query parameter the route does not read is refused with 400
                assert a.field in {p.name for p in route.query}, where
            elif a.kind != "model":  # a body field of the route's request type (dotted: nested)
                assert a.field.split(".")[0] in body_fields, where


# -- a stand-in server for the tenancy, keys and usage routes ---------------------

class _Fake(BaseHTTPRequestHandler):
    answers: ClassVar[dict[tuple[str, str], tuple[int, str, bytes]]] = {}
    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.seen.append((self.command, self.path, self.rfile.read(length)))
        status, ctype, body = self.answers.get((self.command, self.path.split("?")[0]),
                                               (404, "application/json", b'{"error": {"message": "no", "code": "x"}}'))
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Fake]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    _Fake.answers, _Fake.seen = {}, []
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    monkeypatch.setenv("LLMGW_SERVER", f"http://127.0.0.1:{httpd.server_address[1]}")
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "llmgw-admin-test")
    try:
        yield _Fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def _json(status: int, value: Any) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(value).encode()


def test_orgs_list_table(fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    fake.answers[("GET", "/api/v1/orgs")] = _json(200, [
        {"id": "org_aaaaaaaaaaaaaaaa", "name": "acme", "max_key_ttl": 7776000.0, "teams": 2,
         "limits": {"rpm": 60, "budget_period": "month"}, "created_at": 1790000000.0},
        {"id": "org_bbbbbbbbbbbbbbbb", "name": "beta", "max_key_ttl": None, "teams": 0,
         "limits": {}, "created_at": 1790086400.5},
    ])
    assert ctl(capsys, "orgs", "list") == snapshot((0, """\
ID                    NAME  TEAMS  MAX KEY TTL  LIMITS                      CREATED
org_aaaaaaaaaaaaaaaa  acme  2      90d          rpm=60 budget_period=month  2026-09-21T14:13:20Z
org_bbbbbbbbbbbbbbbb  beta  0      -            -                           2026-09-22T14:13:20Z
""", ""))
    fake.answers[("GET", "/api/v1/orgs")] = _json(200, [])
    assert ctl(capsys, "orgs", "list") == snapshot((0, "no orgs\n", ""))


def test_keys_issue_prints_the_key_once(fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    fake.answers[("POST", "/api/v1/keys")] = _json(201, {
        "key": "sk-llmgw-" + "k" * 40, "id": "key_cccccccccccccccc", "name": "ci", "prefix": "sk-llmgw-kkkkkkk",
        "project_id": "proj_dddddddddddddddd", "path": "acme/ml/chat", "user_id": None, "user": None,
        "created_at": 1790000000.0, "expires_at": 1792592000.0, "revoked_at": None,
        "last_used_at": None, "limits": {"rpm": 10}})
    code, out, err = ctl(capsys, "keys", "issue", "acme/ml/chat", "ci", "--ttl", "30d", "--rpm", "10")
    assert (code, out, err) == snapshot((0, "sk-llmgw-kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\n", """\
id:           key_cccccccccccccccc
name:         ci
prefix:       sk-llmgw-kkkkkkk
path:         acme/ml/chat
user:         -
expires_at:   2026-10-21T14:13:20Z
last_used_at: -
revoked_at:   -
project_id:   proj_dddddddddddddddd
user_id:      -
created_at:   2026-09-21T14:13:20Z
limits:       rpm=10
This key will not be shown again: store it now.
"""))
    assert json.loads(fake.seen[-1][2]) == {"project": "acme/ml/chat", "name": "ci", "ttl": "30d",
                                            "limits": {"rpm": 10}}


def test_path_arguments_and_refusals(fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    fake.answers[("PATCH", "/api/v1/projects/acme:ml:chat")] = _json(409, {"error": {
        "message": "a project named chat exists in acme/ops; choose another name", "type": "conflict_error",
        "param": "name", "code": "tenancy.name_taken"}})
    assert ctl(capsys, "projects", "move", "acme/ml/chat", "acme/ops") == snapshot((1, "", """\
error: a project named chat exists in acme/ops; choose another name [tenancy.name_taken]
"""))
    assert json.loads(fake.seen[-1][2]) == {"team": "acme/ops"}
    assert ctl(capsys, "keys", "set", "key_x") == snapshot((2, "", (
        "error: nothing to change: give at least one of --name, --rpm, --tpm, --concurrency, "
        "--budget-tokens, --budget-period\n")))
    assert ctl(capsys, "orgs", "frobnicate")[0] == 2
    fake.answers[("DELETE", "/api/v1/members/ann")] = (204, "application/json", b"")
    assert ctl(capsys, "members", "remove", "ann", "acme/ml/chat") == snapshot(
        (0, "removed ann from acme/ml/chat\n", ""))
    assert fake.seen[-1][1] == "/api/v1/members/ann?scope=project%3Aacme%2Fml%2Fchat"


def test_usage_export_writes_csv(fake: type[_Fake], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = b"period_start,org,requests\n2026-11-01,acme,3\n"
    fake.answers[("GET", "/api/v1/usage/export")] = (200, "text/csv", csv)
    assert ctl(capsys, "usage", "export", "--by", "org") == (0, csv.decode(), "")
    out = tmp_path / "u.csv"
    assert ctl(capsys, "usage", "export", "--period", "day", "--output", str(out))[0] == 0
    assert out.read_bytes() == csv
    assert fake.seen[-1][1] == "/api/v1/usage/export?period=day"
    fake.answers[("GET", "/api/v1/usage")] = _json(200, [{"scope_id": "team_x", "path": "acme/ml", "requests": 5,
                                                           "errors": 1, "prompt_tokens": 10,
                                                           "completion_tokens": 20, "total_tokens": 30}])
    assert ctl(capsys, "usage", "--since", "24h") == snapshot((0, """\
SCOPE    REQUESTS  ERRORS  PROMPT  COMPLETION  TOTAL
acme/ml  5         1       10      20          30
""", ""))
    assert fake.seen[-1][1] == "/api/v1/usage?since=24h"


def test_nodes_join_token_prints_the_token_once(fake: type[_Fake],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    token = "llmgw-join.0123456789ab." + "s" * 32 + "." + "c" * 64
    fake.answers[("POST", "/api/v1/join-tokens")] = _json(201, {
        "id": "0123456789ab", "token": token, "expires_at": 1790001800.0, "ca_sha256": "c" * 64})
    code, out, err = ctl(capsys, "nodes", "join-token", "--ttl", "30m")
    assert (code, out) == (0, token + "\n")
    assert err == snapshot("""\
id:         0123456789ab
expires_at: 2026-09-21T14:43:20Z
ca_sha256:  cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc
This token will not be shown again. On the new node run: llmgw agent --join-token TOKEN --control-plane HOST:AGENT_PORT
""")
    assert json.loads(fake.seen[-1][2]) == {"ttl": "30m"}


def test_join_token_without_a_ca_says_to_run_server_init(
        server: Server, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_SERVER", server.url)
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", server.admin_token)
    code, out, err = ctl(capsys, "nodes", "join-token")
    assert (code, out) == (1, "")
    assert err.replace(str(server.data_dir), "DATA") == snapshot(
        "error: DATA has no ca.crt, ca.key, agent-server.crt, agent-server.key: the agent port "
        "serves mutual TLS and needs the cluster CA; run `llmgw server init --data-dir DATA "
        "--san HOST` (HOST: the name or IP agents dial), or set control_plane.agent_insecure: "
        "true for agents on this machine only [join.no_ca]\n")


# -- scopes as paths ---------------------------------------------------------------

def test_scope_arguments_take_the_path_form(fake: type[_Fake],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # One form for a person (acme, acme/ml, acme/ml/chat); what the admin API takes is
    # made from it here.
    team_id = "team_" + "a" * 16
    sent = {
        ("orgs", "create", "acme"): ("POST", "/api/v1/orgs", {"name": "acme"}),
        ("teams", "create", "acme/ml", "--rpm", "5"):
            ("POST", "/api/v1/teams", {"org": "acme", "name": "ml", "limits": {"rpm": 5}}),
        ("projects", "create", "acme/ml/chat", "--keep-bodies"):
            ("POST", "/api/v1/projects", {"team": "acme/ml", "name": "chat", "keep_bodies": True}),
        ("orgs", "get", "acme"): ("GET", "/api/v1/orgs/acme", None),
        ("teams", "get", "acme/ml"): ("GET", "/api/v1/teams/acme:ml", None),
        ("teams", "get", team_id): ("GET", f"/api/v1/teams/{team_id}", None),
        ("projects", "delete", "acme/ml/chat"): ("DELETE", "/api/v1/projects/acme:ml:chat", None),
        ("teams", "move", "acme/ml", "beta"): ("PATCH", "/api/v1/teams/acme:ml", {"org": "beta"}),
        ("teams", "list", "--in", "acme"): ("GET", "/api/v1/teams?org=acme", None),
        ("projects", "list", "--in", "acme/ml"): ("GET", "/api/v1/projects?team=acme%2Fml", None),
        ("keys", "list", "--in", "acme/ml/chat"):
            ("GET", "/api/v1/keys?project=acme%2Fml%2Fchat", None),
        ("members", "--in", "acme"): ("GET", "/api/v1/members?scope=org%3Aacme", None),
        ("members", "add", "ann", "acme/ml", "--role", "admin"):
            ("POST", "/api/v1/members", {"user": "ann", "scope": "team:acme/ml", "role": "admin"}),
        ("members", "add", "ann", team_id):
            ("POST", "/api/v1/members", {"user": "ann", "scope": team_id, "role": "member"}),
        ("members", "remove", "ann", "acme/ml/chat"):
            ("DELETE", "/api/v1/members/ann?scope=project%3Aacme%2Fml%2Fchat", None),
        ("keys", "issue", "acme/ml/chat", "ci"):
            ("POST", "/api/v1/keys", {"project": "acme/ml/chat", "name": "ci"}),
    }
    for argv, (method, path, body) in sent.items():
        ctl(capsys, *argv)
        assert fake.seen[-1][:2] == (method, path), argv
        assert (json.loads(fake.seen[-1][2]) if fake.seen[-1][2] else None) == body, argv


def test_members_are_shown_at_the_path_a_scope_argument_takes(
        fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    fake.answers[("GET", "/api/v1/members")] = _json(200, [
        {"user_id": "user_x", "user": "ann", "scope": "team:acme/ml", "scope_id": "team_x",
         "role": "admin"}])
    assert ctl(capsys, "members", "list") == snapshot((0, (
        "USER  SCOPE    ROLE\n"
        "ann   acme/ml  admin\n"), ""))


def test_a_malformed_path_is_refused_before_anything_is_sent(
        fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    refused = {
        ("teams", "create", "acme"): "ORG/TEAM: 'acme' does not name a new team: it has 1 name, "
            "and a team's path has 2; give ORG/TEAM, like acme/ml",
        ("projects", "create", "acme//chat"): "ORG/TEAM/PROJECT: 'acme//chat' does not name a "
            "new project: its second name is empty; give ORG/TEAM/PROJECT, like acme/ml/chat",
        ("teams", "get", "Acme/ml"): "ORG/TEAM: 'Acme/ml' does not name a team: 'Acme' is not a "
            "name (a name is 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and "
            "ending with a letter or digit, without '..'); give ORG/TEAM, like acme/ml, or the "
            "team's ID (team_...)",
        ("keys", "issue", "acme/ml", "ci"): "ORG/TEAM/PROJECT: 'acme/ml' does not name a "
            "project: it has 2 names, and a project's path has 3; give ORG/TEAM/PROJECT, like "
            "acme/ml/chat, or the project's ID (proj_...)",
        ("teams", "get", "proj_" + "a" * 16): f"ORG/TEAM: {'proj_' + 'a' * 16!r} does not name "
            "a team: it is a project's ID; give ORG/TEAM, like acme/ml, or the team's ID "
            "(team_...)",
        ("members", "add", "ann", "a/b/c/d"): "SCOPE: 'a/b/c/d' does not name a scope: it has 4 "
            "names, and a project, the deepest scope, has 3; give ORG, ORG/TEAM or "
            "ORG/TEAM/PROJECT, like acme/ml, or an org, team or project ID",
        ("teams", "list", "--in", "acme/"): "--in: 'acme/' does not name an organization: its "
            "second name is empty; give ORG, like acme, or the organization's ID (org_...)",
        ("orgs", "create", "acme/ml"): "ORG: 'acme/ml' does not name a new organization: it has "
            "2 names, and an organization's path has 1; give ORG, like acme",
    }
    for argv, message in refused.items():
        assert ctl(capsys, *argv) == (2, "", f"error: {message}\n"), argv
    assert fake.seen == []


def test_the_forms_a_path_replaces_are_answered_with_it(
        fake: type[_Fake], capsys: pytest.CaptureFixture[str]) -> None:
    answers = {
        ("teams", "create", "acme", "ml"): "teams create takes the new team as one path, "
            "ORG/TEAM, not as two arguments: llmgw ctl teams create acme/ml",
        ("projects", "create", "acme/ml", "chat", "--rpm", "5"): "projects create takes the new "
            "project as one path, ORG/TEAM/PROJECT, not as two arguments: "
            "llmgw ctl projects create acme/ml/chat",
        ("teams", "create", "acme/ml", "x"): "teams create takes the new team as one path, "
            "ORG/TEAM, not as two arguments: llmgw ctl teams create acme/ml",
        ("teams", "list", "--org", "acme"): "--org is spelled --in here, with a path: "
            "llmgw ctl teams list --in acme",
        ("projects", "list", "--team", "acme/ml"): "--team is spelled --in here, with a path: "
            "llmgw ctl projects list --in acme/ml",
        ("keys", "list", "--project", "acme/ml/chat"): "--project is spelled --in here, with a "
            "path: llmgw ctl keys list --in acme/ml/chat",
        ("members", "list", "--scope", "team:acme/ml"): "--scope is spelled --in here, with a "
            "path: llmgw ctl members list --in acme/ml",
        ("members", "add", "ann", "org:acme"): "SCOPE: write the scope as its path, acme, not "
            "org:acme: the number of names says which (ORG, ORG/TEAM or ORG/TEAM/PROJECT)",
    }
    for argv, message in answers.items():
        assert ctl(capsys, *argv) == (2, "", f"error: {message}\n"), argv
    assert fake.seen == []


# -- every output ends with a newline ---------------------------------------------

def test_every_output_ends_with_a_newline(fake: type[_Fake], capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    # A shell prompt after the output starts on its own line, and `$(...)` and `| wc -l`
    # count what they should: tables, single values, JSON, CSV, refusals and usage errors.
    org = {"id": "org_" + "a" * 16, "name": "acme", "teams": 0, "max_key_ttl": None,
           "limits": {}, "created_at": 1790000000.0}
    fake.answers.update({
        ("GET", "/api/v1/orgs"): _json(200, [org]),
        ("GET", "/api/v1/teams"): _json(200, []),
        ("GET", "/api/v1/orgs/acme"): _json(200, org),
        ("DELETE", "/api/v1/orgs/acme"): (204, "application/json", b""),
        ("POST", "/api/v1/keys"): _json(201, {"key": "sk-llmgw-x", "id": "key_x", "name": "ci"}),
        ("POST", "/api/v1/join-tokens"): _json(201, {"id": "t", "token": "llmgw-join.x"}),
        ("GET", "/api/v1/requests/r1/body"): _json(200, {"request": {}, "response": None}),
        ("GET", "/api/v1/usage/export"): (200, "text/csv", b"period_start,requests\n2026-11-01,3"),
        ("GET", "/api/v1/openapi.json"): _json(200, {"paths": {"/x": {"get": {"summary": "x"}}}}),
        ("GET", "/api/v1/leader"): _json(200, {"role": "leader", "id": "cp1"}),
        ("POST", "/api/v1/orgs"): _json(409, {"error": {"message": "taken",
                                                        "code": "tenancy.name_taken"}}),
        ("GET", "/api/v1/users"): (500, "text/plain", b"oops"),
        ("GET", "/api/v1/nodes"): _json(401, {"error": {"message": "no",
                                                        "code": "auth.bad_token"}}),
    })
    misspelt = tmp_path / "server.yaml"
    misspelt.write_text("gatway: {}\n")
    runs = [
        ["ctl", "orgs", "list"], ["ctl", "orgs", "list", "--json"], ["ctl", "teams", "list"],
        ["ctl", "orgs", "get", "acme"], ["ctl", "orgs", "delete", "acme"],
        ["ctl", "keys", "issue", "acme/ml/chat", "ci"], ["ctl", "nodes", "join-token"],
        ["ctl", "requests", "body", "r1"], ["ctl", "usage", "export"],
        ["ctl", "usage", "export", "--output", str(tmp_path / "u.csv")],
        ["ctl", "api", "routes"], ["ctl", "leader"],
        ["ctl", "orgs", "create", "acme"], ["ctl", "users", "list"], ["ctl", "nodes"],
        ["ctl", "keys", "set", "key_x"], ["ctl", "teams", "create", "acme"],
        ["ctl", "orgs", "frobnicate"], ["ctl", "--help"], ["ctl", "teams", "create", "--help"],
        ["ctl", "--server", "http://127.0.0.1:9", "orgs", "list"],
        ["ctl", "--server", "ftp://x", "orgs", "list"], ["--help"], ["version"], ["alerts"],
        ["config", "defaults"], ["config", "check", str(misspelt)],
    ]
    for argv in runs:
        with contextlib.suppress(SystemExit):  # --help and usage errors exit
            main(argv)
        out = capsys.readouterr()
        assert out.out or out.err, argv
        for stream in (out.out, out.err):
            assert stream == "" or stream.endswith("\n"), (argv, stream[-80:])
