"""SQL metacharacters in Authorization, ids and filters (docs/reliability.md) through the
real admin API and gateway on PostgreSQL: every answer is a 4xx with a message (or an empty
match for a free-text filter), never a 5xx, and nothing in the store changed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.cluster import Cluster
from tests.support.pg import drop_pg_database, fresh_pg_database

HOSTILE = ["' OR '1'='1", "x'; DROP TABLE api_keys; --", "1; SELECT pg_sleep(5)--", "%' OR 1=1 --",
           "\\'; DELETE FROM orgs; --", "key_a' UNION SELECT * FROM api_keys --"]


@pytest.fixture
def pg_cluster(tmp_path: Path) -> Iterator[Cluster]:
    url = fresh_pg_database()
    c = Cluster(tmp_path, store=url)
    try:
        yield c
    finally:
        c.stop()
        drop_pg_database(url)


def _chat(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:  # closes its connection: a collected one warns
            return int(e.code), json.loads(e.read())


def test_sql_in_ids_filters_and_keys_is_plain_data(pg_cluster: Cluster) -> None:
    c = pg_cluster
    sim = c.sim()
    key = c.key()
    gw = c.gateway(sim)
    def state() -> dict[str, Any]:
        # Everything but a key's last use, which the good requests below move on.
        return {p: [{k: v for k, v in row.items() if not k.startswith("last_used")} for row in c.call("GET", p)]
                for p in ("/api/v1/orgs", "/api/v1/teams", "/api/v1/projects", "/api/v1/keys")}

    before = state()
    answers: list[tuple[str, int, bytes]] = []
    for sql in HOSTILE:
        q = quote(sql, safe="")
        for method, path, body in [
            ("GET", f"/api/v1/keys/{q}", None), ("PATCH", f"/api/v1/keys/{q}", {"name": "x"}),
            ("POST", f"/api/v1/keys/{q}/revoke", {}), ("GET", f"/api/v1/orgs/{q}", None),
            ("GET", f"/api/v1/projects/{q}", None), ("GET", f"/api/v1/requests/{q}", None),
            ("GET", f"/api/v1/keys?project={q}", None), ("GET", f"/api/v1/usage?by={q}", None),
            ("GET", f"/api/v1/usage/export?by={q}", None), ("GET", f"/api/v1/audit?since={q}", None),
            ("POST", "/api/v1/orgs", {"name": sql}), ("POST", "/api/v1/keys", {"project": sql, "name": "x"}),
            ("POST", "/api/v1/teams", {"org": sql, "name": "t"}),
        ]:
            a = c.admin.call(method, path, body=None if body is None else json.dumps(body).encode())
            answers.append((f"{method} {path}", a.status, a.body))
        # Free-text filters take anything: they match nothing here, as plain text.
        for path in (f"/api/v1/audit?actor={q}", f"/api/v1/audit?contains={q}"):
            a = c.admin.call("GET", path)
            assert a.status in (200, 400), (path, a.status, a.body)
            if a.status == 200:
                assert json.loads(a.body) == [], (path, a.body)
        for headers in ({"authorization": f"Bearer {sql}"}, {"authorization": f"Bearer sk-llmgw-{sql}"},
                        {"authorization": sql}, {"authorization": f"Bearer {key['key']}", "x-request-id": sql}):
            status, doc = _chat(gw.url, headers)
            answers.append((f"gateway {headers}", status, json.dumps(doc).encode()))
    for what, status, raw in answers:
        if what.startswith("gateway") and "x-request-id" in what:
            assert status == 200, (what, raw)  # a client's request id is never used, whatever it holds
            continue
        assert 400 <= status < 500, (what, status, raw)
        assert json.loads(raw)["error"]["message"], (what, raw)
    assert state() == before
    assert _chat(gw.url, {"authorization": f"Bearer {key['key']}"})[0] == 200
