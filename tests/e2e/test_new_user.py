"""Tenancy, keys, limits and usage, as a new user would walk through them, with real processes.

`llmgw up --engine sim` (control plane, local agent running the simulator,
gateway) → the key it printed works
through the `openai` package → `llmgw ctl keys issue` gives a second key → the
requests show in `ctl usage` and in the CSV export, and each one's record says
who made it and where it went → `ctl keys revoke` → that key gets 401 within
two seconds, and the other still works.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from llmgw.cli.ctl.client import Client
from llmgw.secrets.datadir import read_admin_token
from tests.support.control_plane import up_ports
from tests.support.procs import start_process, wait_for

REVOKE_DEADLINE = 2.0


def ctl(data_dir: Path, admin_port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `llmgw ctl` against the control plane `up` started."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", "ctl", "--server", f"http://127.0.0.1:{admin_port}",
         "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=30, check=False)


def ask(base_url: str, key: str) -> tuple[str, str]:
    """One chat completion through the gateway; returns the text and the request's id (the
    answer's x-request-id), as a user reads them from the `openai` package."""
    with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=10) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="sim-model", messages=[{"role": "user", "content": "hello"}])
        return raw.parse().choices[0].message.content or "", raw.headers["x-request-id"]


def admin_record(admin: Client, rid: str) -> dict[str, Any] | None:
    """GET /api/v1/requests/{rid}, or None while the request has no record."""
    answer = admin.call("GET", f"/api/v1/requests/{rid}")
    return json.loads(answer.body) if answer.status == 200 else None


def test_issue_use_account_revoke(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # Port 0 each: up and the control plane bind ports the kernel picks and name them.
    args = [sys.executable, "-m", "llmgw.cli.main", "up", "--port", "0", "--admin-port", "0",
            "--agent-port", "0", "--data-dir", str(data_dir),
            "--engine", "sim", "--ttft-ms", "1", "--itl-ms", "0"]
    with start_process(args, "llmgw up: ready", timeout=60) as up:
        port, admin_port = up.port, up_ports(up.output)[0]
        m = re.search(r"(sk-llmgw-[A-Za-z0-9_-]{40})", up.output)
        assert m, up.output
        first = m.group(1)
        placed = re.search(r"\(replica (\S+)\)", up.output)
        assert placed, up.output
        base = f"http://127.0.0.1:{port}/v1"
        assert ask(base, first)[0]

        issued = ctl(data_dir, admin_port, "--json", "keys", "issue", "default/default/default", "ci")
        assert issued.returncode == 0, issued.stderr
        second = json.loads(issued.stdout)
        assert second["key"].startswith(second["prefix"])
        text, rid = ask(base, second["key"])
        assert text

        def usage_counts() -> bool:
            out = ctl(data_dir, admin_port, "--json", "usage", "--by", "project")
            rows = json.loads(out.stdout) if out.returncode == 0 else []
            return any(r["path"] == "default/default/default" and r["requests"] == 2 for r in rows)

        wait_for("both requests showing in `ctl usage`", usage_counts, 10)
        export = ctl(data_dir, admin_port, "usage", "export", "--by", "project,key", "--period", "day")
        assert export.returncode == 0, export.stderr
        rows = list(csv.DictReader(io.StringIO(export.stdout)))
        assert [r["requests"] for r in rows] == ["1", "1"], export.stdout
        assert second["id"] in {r["key_id"] for r in rows}
        assert {r["project_id"] for r in rows} == {second["project_id"]}

        record = ctl(data_dir, admin_port, "--json", "requests", "get", rid)
        assert record.returncode == 0, record.stderr
        view = json.loads(record.stdout)
        assert view["key_id"] == second["id"] and view["replica"] == placed.group(1)
        assert view["status"] == "ok" and view["completion_tokens"] > 0

        revoked = ctl(data_dir, admin_port, "keys", "revoke", second["id"])
        assert revoked.returncode == 0, revoked.stderr
        t0 = time.monotonic()
        while True:
            try:
                ask(base, second["key"])
            except openai.AuthenticationError as e:
                assert e.status_code == 401
                break
            assert time.monotonic() - t0 < REVOKE_DEADLINE, "a revoked key still worked after 2 s"
            time.sleep(0.05)
        assert ask(base, first)[0], "the other key must keep working"

        # A kept request replayed to a model (`ctl requests replay`): the control plane sends it
        # through the real gateway, which runs it as the original key.
        kept = ctl(data_dir, admin_port, "projects", "set", "default/default/default", "--keep-bodies")
        assert kept.returncode == 0, kept.stderr
        admin = Client(f"http://127.0.0.1:{admin_port}", read_admin_token(data_dir), timeout=30)
        rids: list[str] = []

        def kept_request() -> str | None:  # once the gateways' snapshot says keep_bodies
            rids.append(ask(base, first)[1])
            return next((r for r in rids if admin.call("GET", f"/api/v1/requests/{r}/body").status == 200), None)

        original = wait_for("a request with its body kept", kept_request, 15)
        replayed = ctl(data_dir, admin_port, "--json", "requests", "replay", original, "--model", "sim-model")
        assert replayed.returncode == 0, replayed.stderr
        answer = json.loads(replayed.stdout)
        assert answer["choices"][0]["message"]["content"] and answer["model"] == "sim-model"
        again = answer["id"].removeprefix("chatcmpl-")  # the gateway's request id, as for any answer
        key_of = json.loads(ctl(data_dir, admin_port, "--json", "requests", "get", original).stdout)["key_id"]
        assert wait_for("the replay's record", lambda: admin_record(admin, again), 10)["key_id"] == key_of
        # The replay runs as a tenant's key: the audit log says who sent it, where, and what became of it.
        [event] = json.loads(ctl(data_dir, admin_port, "--json", "audit", "--contains", "request.replay").stdout)
        assert (event["target"], event["after"]) == (f"request:{original}", {
            "model": "sim-model", "key_id": key_of, "status": 200, "request_id": again})
