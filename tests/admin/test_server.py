"""`llmgw server` as a real process: the table is what is mounted, tokens, files, listener."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from inline_snapshot import snapshot

from llmgw.admin.matching import split
from llmgw.admin.table import ROUTES
from tests.support.control_plane import Server, scrape, start_server
from tests.support.pg import drop_pg_database, fresh_pg_database


def _concrete(path: str) -> str:
    # Any value reaches the route; the handler may then answer 404 for it.
    return "/".join("x" if s is None else s for s in split(path))


def test_every_table_route_is_mounted(server: Server) -> None:
    for r in ROUTES:
        status, _, body = server.call(r.method, _concrete(r.path), "gateway" if r.internal else "admin",
                                      body=b"{}" if r.request is not None else None)
        # A handler may answer 404 for the object "x"; the router's own 404 has its code.
        code = body["error"]["code"] if isinstance(body, dict) and "error" in body else None
        assert status != 405 and code != "admin.not_found", f"{r.method} {r.path}: {status}"


def test_nothing_is_mounted_outside_the_table(server: Server) -> None:
    table = {(r.method, r.path) for r in ROUTES}
    probes = ["/", "/api", "/api/v1", "/api/v1/", "/api/v1/openapi.json/", "/internal/v1",
              "/api/v1/admin", "/metrics/", "/healthz", "/docs", "//api/v1/openapi.json"]
    for path in probes:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            status, _, body = server.call(method, path)
            assert status == 404, (method, path, status)
            assert body["error"]["code"] == "admin.not_found"
    # Every method the table does not list on a path is a 405 naming those it does.
    for r in ROUTES:
        listed = sorted(m for m, p in table if p == r.path)
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - set(listed):
            status, headers, _ = server.call(method, _concrete(r.path))
            assert status == 405 and headers["allow"] == ", ".join(listed), (method, r.path)


def test_the_openapi_document_lists_every_route(server: Server) -> None:
    from openapi_spec_validator import validate

    status, headers, doc = server.call("GET", "/api/v1/openapi.json")
    assert status == 200 and headers["content-type"] == "application/json"
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == {(r.method, r.path) for r in ROUTES}


def test_tokens_are_required_and_never_echoed(server: Server) -> None:
    status, _, body = server.call("GET", "/api/v1/openapi.json", token=None)
    assert (status, body) == snapshot((401, {"error": {
        "message": "this route needs a bearer token: send `Authorization: Bearer <admin token>`; "
                   "the admin token is in DATA/admin-token on the control plane's machine",
        "type": "authentication_error", "param": None, "code": "auth.missing_token"}}))
    wrong = "llmgw-admin-wrong' OR '1'='1"
    status, _, body = server.call("GET", "/api/v1/openapi.json", token=wrong)
    assert status == 401 and body["error"]["code"] == "auth.bad_token"
    assert wrong not in str(body)
    # The gateway token does not open admin routes.
    status, _, body = server.call("GET", "/api/v1/openapi.json", token="gateway")
    assert status == 403 and body["error"]["code"] == "auth.wrong_token"
    assert server.gateway_token not in str(body)


def test_internal_routes_refuse_the_admin_token(server: Server) -> None:
    internal = [r for r in ROUTES if r.internal]
    for r in internal:
        status, _, body = server.call(r.method, _concrete(r.path), token="admin")
        assert status == 403 and body["error"]["code"] == "auth.wrong_token"


def test_query_string_credentials_are_refused(server: Server) -> None:
    for name in ("key", "api_key", "token"):
        status, _, body = server.call("GET", f"/api/v1/openapi.json?{name}=sk-llmgw-abc", token=None)
        assert status == 400 and body["error"]["code"] == "auth.credentials_in_query"
        assert "sk-llmgw-abc" not in body["error"]["message"]
    status, _, body = server.call("GET", "/api/v1/openapi.json?api_key=x")
    assert (status, body["error"]["message"]) == snapshot((
        400, "the query parameter 'api_key' looks like a credential, and credentials go in the "
             "Authorization header (Authorization: Bearer <token>), never in a URL, which proxies and "
             "logs keep; remove it"))


def test_sql_in_headers_and_query_is_a_4xx_with_a_message(server: Server) -> None:
    sql = "'; DROP TABLE schema_migrations; --"
    for headers in ({"Authorization": f"Bearer {sql}"}, {"Authorization": sql},
                    {"X-Request-Id": sql}, {"Content-Type": sql}):
        status, got, body = server.call("GET", "/api/v1/openapi.json", token=None, headers=headers)
        assert 400 <= status < 500 and body["error"]["message"], headers
        assert got["x-request-id"] != sql
    status, _, body = server.call("GET", "/api/v1/openapi.json?x=1%27%20OR%201%3D1")
    assert status == 400 and body["error"]["code"] == "admin.unknown_parameter"
    # The store still answers: nothing was dropped.
    assert server.call("GET", "/api/v1/openapi.json")[0] == 200


def test_token_files_are_owner_only_and_the_listener_is_loopback(server: Server) -> None:
    for name in ("secret", "admin-token", "llmgw.db"):
        assert stat.S_IMODE((server.data_dir / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    assert server.url.startswith("http://127.0.0.1:")
    first, listening = server.proc.output.splitlines()[:2]
    # No `llmgw server init` here: the agent port stays closed, and the start says so.
    assert first.startswith("warning: the agent port stays closed: ")
    assert f"run `llmgw server init --data-dir {server.data_dir} --san HOST`" in first
    assert listening == f"llmgw control plane listening on {server.url}"


def test_a_token_readable_by_others_stops_the_start(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    srv.proc.terminate()
    os.chmod(srv.data_dir / "admin-token", 0o644)
    out = subprocess.run([sys.executable, "-m", "llmgw", "server", "--data-dir", str(srv.data_dir),
                          "--port", "1"], capture_output=True, text=True, timeout=30, check=False)
    text = out.stderr.replace(str(srv.data_dir), "DATA")
    assert (out.returncode, text) == snapshot((
        2, "error: DATA/admin-token is readable by group or others (mode 0644) and holds a secret; "
           "run `chmod 600 DATA/admin-token` and start again\n"))


def _policies(pid: int) -> set[int]:
    """The scheduling policy of every thread of `pid` and of its children (granian's worker)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a short-lived thread (a SQLite call's) may end meanwhile
            out.add(os.sched_getscheduler(int(task.name)))
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in children:
            out |= _policies(int(child))
    return out


def test_the_control_plane_never_preempts_a_gateway(server: Server, tmp_path: Path) -> None:
    # SCHED_BATCH by default, worker and threads included: usage ingestion must not cut a
    # gateway's request path short on a shared machine.
    assert _policies(server.proc.popen.pid) == {os.SCHED_BATCH}
    other = tmp_path / "normal"  # the fixture's server has tmp_path's data dir
    other.mkdir()
    srv = start_server(other, config={"control_plane": {"cpu_scheduling": "normal"}})
    with srv.proc:
        assert _policies(srv.proc.popen.pid) == {os.SCHED_OTHER}


def test_connections_that_send_nothing_are_closed_at_the_header_timeout(tmp_path: Path) -> None:
    # The admin listener is where gateways post usage and take leases: a client holding
    # granian's places with connections that send nothing would cut them all off.
    srv = start_server(tmp_path, config={"control_plane": {"admin_header_timeout": "1s"}})
    with srv.proc:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
        t0 = time.monotonic()
        for s in silent:
            s.settimeout(max(t0 + 6 - time.monotonic(), 0.1))
            assert s.recv(1) == b"", "a connection that sent nothing was answered"
            s.close()
        waited = time.monotonic() - t0
        assert 0.9 < waited < 6, f"silent connections closed after {waited:.1f}s"
        assert scrape(srv)["llmgw_admin_connections_closed_total"] == 20
        status, _, _ = srv.call("GET", "/api/v1/orgs")  # served throughout
        assert status == 200


def test_sigterm_stops_cleanly(server: Server) -> None:
    server.proc.popen.send_signal(signal.SIGTERM)
    assert server.proc.popen.wait(15) == 0
    assert "Traceback" not in server.proc.output


def test_postgresql_store(tmp_path: Path) -> None:
    url = fresh_pg_database()
    try:
        srv = start_server(tmp_path, url)
        with srv.proc:
            status, _, doc = srv.call("GET", "/api/v1/openapi.json")
            assert status == 200 and doc["openapi"] == "3.1.0"
            for r in ROUTES:
                status, _, _ = srv.call(r.method, _concrete(r.path), "gateway" if r.internal else "admin",
                                        body=b"{}" if r.request is not None else None)
                assert status < 500, (r.method, r.path, status)
    finally:
        drop_pg_database(url)


def test_url_host_brackets_ipv6_only() -> None:
    from llmgw.config import url_host

    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("node-1.example") == "node-1.example"
    assert url_host("::1") == "[::1]"
    assert url_host("fd00::2") == "[fd00::2]"
