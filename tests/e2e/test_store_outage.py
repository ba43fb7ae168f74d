"""PostgreSQL unreachable for a few seconds (docs/reliability.md, "DB down"): the documented mode.

Gateways hold keys in memory and the limits authority counts in the control plane's
memory, so requests with a valid key go on being answered; the usage of those requests
cannot be written, so the gateway keeps it and sends it again; once the database answers
again every request has exactly one record and the rollup counts each once.

The outage is a TCP forwarder in front of the machine's PostgreSQL that is cut and
restored: the server itself is shared by every test and is never stopped.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, chat, chat_status
from tests.support.pg import drop_pg_database, fresh_pg_database
from tests.support.tcp_cut import TcpCut

OUTAGE = 4.0
"""Shorter than the leader lease's renew deadline (2/3 of the 10 s TTL): the leader stays."""


def test_requests_go_on_and_their_usage_lands_once_after_the_store_returns(tmp_path: Path) -> None:
    url = fresh_pg_database()
    name = url.rsplit("/", 1)[1]
    try:
        with TcpCut(("127.0.0.1", 5432)) as cut:
            cluster = Cluster(tmp_path, store=f"postgresql://postgres@127.0.0.1:{cut.port}/{name}")
            try:
                _run(cluster, cut)
            finally:
                cluster.stop()
    finally:
        drop_pg_database(url)


def _run(cluster: Cluster, cut: TcpCut) -> None:
    sim = cluster.sim()
    key = cluster.key()
    gw = cluster.gateway(sim)
    sent: list[str] = []

    def call() -> int:
        status, rid = chat(gw.url, key["key"])
        sent.append(rid)
        return status

    assert [call() for _ in range(5)] == [200] * 5

    cut.cut()
    t0 = time.monotonic()
    during = 0
    while time.monotonic() - t0 < OUTAGE:
        assert call() == 200, "a valid key is served from memory while the store is down"
        during += 1
        time.sleep(0.1)
    # The admin API needs the store: it says so, in the error shape (a 503 to retry, not a 500).
    answer = cluster.admin.call("GET", "/api/v1/orgs")
    assert answer.status == 503, (answer.status, answer.body)
    error = json.loads(answer.body)["error"]
    assert "store" in error["message"].lower(), error
    cut.restore()

    assert [call() for _ in range(5)] == [200] * 5
    assert cluster.server.popen.poll() is None, cluster.server.output
    # Shorter than the renew deadline: no demotion (as Patroni's retry_timeout).
    assert "stepping down" not in cluster.server.output
    assert cluster.call("GET", "/api/v1/leader")["role"] == "leader"


    deadline = time.monotonic() + 20
    while True:
        views = {rid: cluster.request_record(rid) for rid in sent}
        missing = [rid for rid, v in views.items() if v is None or v["state"] != "final"]
        if not missing:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"{len(missing)} of {len(sent)} requests without a final record after the "
                        f"store came back: {missing[:5]}\n{gw.output[-3000:]}")
        time.sleep(0.5)
    rows = cluster.call("GET", "/api/v1/usage?by=project&since=1h")
    assert sum(r["requests"] for r in rows) == len(sent)
    assert "cannot post" in gw.output, "the outage was seen by the gateway, not missed"
    print(f"{len(sent)} requests ({during} during a {OUTAGE} s outage), each accounted once")


def test_an_outage_past_the_lease_fails_closed_and_heals(tmp_path: Path) -> None:
    """Past the lease the leader steps down: nobody runs the limits authority, so a key with
    limits is refused (fail-closed, 503) while an unlimited one is still served; when the
    store returns the control plane takes the lease again by itself and limits work again."""
    url = fresh_pg_database()
    name = url.rsplit("/", 1)[1]
    try:
        with TcpCut(("127.0.0.1", 5432)) as cut:
            cluster = Cluster(tmp_path, {"leader_lease_ttl": 2.0},
                              store=f"postgresql://postgres@127.0.0.1:{cut.port}/{name}")
            try:
                sim = cluster.sim()
                limited = cluster.key({"rpm": 10_000})
                free = cluster.key()
                gw = cluster.gateway(sim)
                assert chat_status(gw.url, limited["key"]) == 200
                cut.cut()
                time.sleep(2.0 + 1.5)  # past the lease: the leader has stepped down
                statuses = [chat_status(gw.url, limited["key"]) for _ in range(3)]
                assert statuses == [503] * 3, (statuses, cluster.server.output[-3000:])
                assert chat_status(gw.url, free["key"]) == 200
                # What an alert on `sum(llmgw_control_plane_leader) == 0` reads meanwhile; a
                # probe still answers, without the store.
                assert _leader_gauge(cluster) == 0
                health = urllib.request.urlopen(cluster.server.url + "/health", timeout=10)
                assert json.loads(health.read()) == {"status": "ok", "role": "standby"}
                cut.restore()
                deadline = time.monotonic() + 15
                while chat_status(gw.url, limited["key"]) != 200:
                    assert time.monotonic() < deadline, f"never led again:\n{cluster.server.output[-3000:]}"
                    time.sleep(0.5)
                assert cluster.server.popen.poll() is None
                leader = cluster.call("GET", "/api/v1/leader")
                assert leader["role"] == "leader", leader
                assert _leader_gauge(cluster) == 1
                assert "stepping down so that no two control planes place replicas" in cluster.server.output
            finally:
                cluster.stop()
    finally:
        drop_pg_database(url)


def _leader_gauge(cluster: Cluster) -> float:
    """`llmgw_control_plane_leader` as the control plane's GET /metrics says it."""
    with urllib.request.urlopen(cluster.server.url + "/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return float(next(ln.split()[1] for ln in lines if ln.startswith("llmgw_control_plane_leader ")))
