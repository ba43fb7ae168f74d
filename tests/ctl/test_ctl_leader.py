"""`llmgw ctl leader`: who leads, as the operator reads it (SQLite: this one, always)."""

from __future__ import annotations

import re

import pytest
from inline_snapshot import snapshot

from tests.ctl.test_ctl import ctl
from tests.support.control_plane import Server


def test_leader_on_sqlite(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ctl(capsys, "--server", server.url, "--data-dir", str(server.data_dir),
                         "leader")
    out = re.sub(r"\b[0-9a-f]{12}\b", "ID", out.replace(server.url, "URL"))
    out = re.sub(r"\d{4}-\d\d-\d\dT[\d:]+Z", "TIME", re.sub(r"127\.0\.0\.1:\d+", "ADDR", out))
    assert (code, out, err) == snapshot((0, """\
role:                 leader
id:                   ID
store:                sqlite
leader_id:            ID
leader_admin_url:     URL
leader_agent_address: ADDR
leader_since:         TIME
lease_ttl:            -
""", ''))
