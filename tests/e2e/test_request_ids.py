"""A client cannot choose its request's id: usage counts each id once, so a chosen id sent
again would have had several requests counted as one (and a token budget, read again from
the usage rollups after a restart, bypassed)."""

from __future__ import annotations

import time

from tests.support.cluster import Cluster, chat


def test_requests_sent_with_one_client_id_are_each_counted(cluster: Cluster) -> None:
    sim = cluster.sim("--output-tokens", "3")
    key = cluster.key()["key"]
    gw = cluster.gateway(sim)
    deadline = time.monotonic() + 20
    while (status := chat(gw.url, key, 3)[0]) != 200:  # 503 until the worker has its keys
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.1)

    answers = [chat(gw.url, key, 3, headers={"x-request-id": "same"}) for _ in range(3)]
    assert [s for s, _ in answers] == [200] * 3
    ids = [rid for _, rid in answers]
    assert "same" not in ids and len(set(ids)) == 3, ids

    deadline = time.monotonic() + 10
    while True:
        rows = cluster.call("GET", "/api/v1/usage?by=project&since=1h")
        counted = sum(r["requests"] for r in rows)
        if counted >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counted == 4, rows  # the warm-up and the three: each once
    assert rows[0]["completion_tokens"] == 4 * 3, rows
    for rid in ids:
        record = cluster.request_record(rid)
        assert record is not None and record["state"] == "final" and record["status"] == "ok", record
    assert cluster.request_record("same") is None
