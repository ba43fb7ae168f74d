"""Canary secrets (docs/reliability.md): the cluster secret, the admin token, the
gateway token and API keys never appear in any output of a run.

A control plane, a simulator and a gateway run a session that touches every path a secret
could leak through: good requests, refused keys (revoked, in the URL, in the wrong scheme),
engine errors mid-stream, a request record, usage, audit and exports, /health, /ready and
/metrics (the gateway's and the control plane's), a store outage of the admin API... Then
every answer, every line the processes printed and the store file itself are searched for
each secret and for the parts of it a careless truncation would print.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmgw.secrets.datadir import read_admin_token, read_secret
from llmgw.secrets.keys import GATEWAY_TOKEN_LABEL, derive
from tests.support.cluster import Cluster


def _http(url: str, body: dict[str, object] | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return int(r.status), "".join(f"{k}: {v}\n" for k, v in r.headers.items()) + r.read().decode()
    except urllib.error.HTTPError as e:
        with e:  # closes its connection: a collected one warns
            return int(e.code), "".join(f"{k}: {v}\n" for k, v in e.headers.items()) + e.read().decode()


def _needles(secret: str) -> list[str]:
    """The secret, and the pieces a log that truncates or splits it would still print."""
    return [secret, secret[-12:], secret[len(secret) // 2:][:16]]


def test_no_secret_in_any_answer_log_or_stored_row(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    outputs: list[str] = []
    try:
        sim = cluster.sim()
        gw = cluster.gateway(sim, workers=2)
        key = cluster.key({"rpm": 1000})["key"]
        revoked = cluster.key()
        cluster.call("POST", f"/api/v1/keys/{revoked['id']}/revoke", {})
        admin_token = read_admin_token(cluster.data_dir)
        secret = read_secret(cluster.data_dir)
        canaries = {
            "api key": key, "revoked api key": revoked["key"], "admin token": admin_token,
            "cluster secret": secret.hex(), "gateway token": derive(secret, GATEWAY_TOKEN_LABEL).hex(),
        }
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        v1 = gw.url + "/v1/chat/completions"
        bearer = {"authorization": f"Bearer {key}"}
        answers = [
            _http(v1, chat, bearer),
            _http(v1, {**chat, "stream": True}, bearer),
            _http(v1, {**chat, "stream": True}, {**bearer, "x-sim-fault": "error-after=2"}),
            _http(v1, {**chat, "stream": True}, {**bearer, "x-sim-fault": "reset-after=2"}),
            _http(v1, chat, {**bearer, "x-sim-fault": "fail=500"}),
            _http(v1, {**chat, "model": "no-such-model"}, bearer),
            _http(v1, chat, {"authorization": f"Bearer {revoked['key']}"}),
            _http(v1, chat, {"authorization": f"Basic {key}"}),
            _http(v1, chat, {"authorization": f"Bearer {key}x"}),
            _http(v1, chat, {"authorization": f"Bearer {admin_token}"}),
            _http(f"{v1}?api_key={key}", chat, bearer),
            _http(v1 + "?key=" + secret.hex(), chat, {"x-api-key": key}),
            _http(gw.url + "/health"), _http(gw.url + "/ready"), _http(gw.url + "/metrics"),
            _http(gw.url + "/v1/models", None, bearer),
        ]
        admin = {"authorization": f"Bearer {admin_token}"}
        api = cluster.server.url + "/api/v1"
        # The streamed request's record, by the id its answer carried.
        rid = re.search(r"^x-request-id: (\S+)$", answers[1][1], re.MULTILINE | re.IGNORECASE)
        assert rid, answers[1][1][:500]
        deadline = time.monotonic() + 10  # usage is shipped every 0.5 s: wait for the record
        while _http(api + f"/requests/{rid[1]}", None, admin)[0] != 200:
            assert time.monotonic() < deadline, "the request record never arrived"
            time.sleep(0.2)
        for path in ("/keys", "/usage?by=project&since=1h", "/usage/export?by=project,key,model",
                     "/usage/export?format=json&by=key", f"/requests/{rid[1]}", "/audit?limit=100",
                     "/openapi.json", "/leader", "/orgs", "/users"):
            answers.append(_http(api + path, None, admin))
        answers += [
            _http(api + "/keys", None, {"authorization": f"Bearer {key}"}),
            _http(api + "/keys", None, {"authorization": f"Bearer {admin_token[:-1]}"}),
            _http(api + f"/keys?token={admin_token}", None, admin),
            _http(cluster.server.url + "/internal/v1/snapshot", None, admin),
            # After every call above: the control plane's scrape has counted them all.
            _http(cluster.server.url + "/metrics"), _http(cluster.server.url + "/health"),
        ]
        assert answers[0][0] == 200 and answers[1][0] == 200, answers[:2]
        assert [a[0] for a in answers[6:11]] == [401] * 5, [a[0] for a in answers[6:11]]
        outputs += [body for _, body in answers]
    finally:
        cluster.stop()
    outputs += [p.output for p in cluster.procs]
    stored = b"".join(p.read_bytes() for p in cluster.data_dir.iterdir()
                      if p.is_file() and p.name not in ("secret", "admin-token"))
    assert len(stored) > 10_000, "the store file was read"
    text = "\n".join(outputs)
    assert rid[1] in text and "sk-llmgw-" in text, "the run was seen (key prefixes are shown)"
    for name, value in canaries.items():
        for needle in _needles(value):
            assert needle not in text, f"the {name} (or part of it) is in an output"
            assert needle.encode() not in stored, f"the {name} (or part of it) is in the store"
