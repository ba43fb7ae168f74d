"""GET /metrics and GET /health of a real `llmgw server`: no token, what they count, no secret."""

from __future__ import annotations

import time

import msgspec

from llmgw.protocol import wire
from tests.support.control_plane import Server, scrape
from tests.support.usage import final, opened


def _post(server: Server, batch: wire.UsageBatch) -> int:
    status, _, body = server.call("POST", "/internal/v1/usage", "gateway", msgspec.json.encode(batch),
                                  {"content-type": "application/json"})
    assert status in (200, 204), body
    return status


def test_health_answers_without_a_token_and_says_the_role(server: Server) -> None:
    status, _, body = server.call("GET", "/health", token=None)
    assert (status, body) == (200, {"status": "ok", "role": "leader"})
    # A wrong token does not make a probe fail: it reads no token at all.
    assert server.call("GET", "/health", token="not-a-token")[0] == 200


def test_metrics_count_usage_posts_and_records_as_stored(server: Server) -> None:
    before = scrape(server)
    assert before["llmgw_control_plane_leader"] == 1
    assert before['llmgw_usage_records_total{kind="counted"}'] == 0
    assert before["llmgw_usage_last_post_timestamp_seconds"] == 0
    assert before["llmgw_snapshot_keys"] == 0
    assert "process_resident_memory_bytes" in before

    now = time.time()
    batch = wire.UsageBatch(gateway_id="gw_metrics", finals=[final(f"r{i}", at=now) for i in range(3)],
                            opens=[opened("r9", at=now)])
    status = _post(server, batch)
    _post(server, batch)  # sent again, as a gateway does when it did not get the answer
    got = scrape(server)

    def records(kind: str) -> float:
        return got[f'llmgw_usage_records_total{{kind="{kind}"}}']

    assert (records("counted"), records("duplicate"), records("corrected")) == (3, 3, 0)
    assert records("open") == 2  # received twice; the store keeps the one open once
    assert got['llmgw_usage_posts_total{outcome="stored"}'] == 2
    assert got['llmgw_usage_posts_total{outcome="failed"}'] == 0
    assert got["llmgw_usage_ingest_seconds_count"] == 2
    assert got["llmgw_usage_gateways"] == 1
    assert now - 1 <= got["llmgw_usage_last_post_timestamp_seconds"] <= time.time() + 1
    assert got[f'llmgw_admin_requests_total{{code="{status}",method="POST",route="/internal/v1/usage"}}'] == 2


def test_metrics_count_admin_answers_by_route_template(server: Server) -> None:
    assert server.call("POST", "/api/v1/orgs", body=b'{"name": "acme"}')[0] == 201
    assert server.call("GET", "/api/v1/orgs/acme")[0] == 200
    assert server.call("GET", "/api/v1/orgs/nobody")[0] == 404
    assert server.call("GET", "/api/v1/orgs", token="wrong")[0] == 401
    assert server.call("GET", "/api/v1/nowhere")[0] == 404
    got = scrape(server)

    def answers(method: str, route: str, code: int) -> float:
        return got.get(f'llmgw_admin_requests_total{{code="{code}",method="{method}",route="{route}"}}', 0)

    assert answers("POST", "/api/v1/orgs", 201) == 1
    # The template, not the name asked for: no tenant's name becomes a label.
    assert answers("GET", "/api/v1/orgs/{org}", 200) == 1
    assert answers("GET", "/api/v1/orgs/{org}", 404) == 1
    assert answers("GET", "/api/v1/orgs", 401) == 1
    assert answers("GET", "unmatched", 404) == 1
    assert got['llmgw_admin_request_duration_seconds_count{method="GET",route="/api/v1/orgs/{org}"}'] == 2

    # A key issued shows in the snapshot's gauge once the publisher has rebuilt it.
    assert server.call("POST", "/api/v1/teams", body=b'{"org": "acme", "name": "ml"}')[0] == 201
    assert server.call("POST", "/api/v1/projects", body=b'{"team": "acme/ml", "name": "chat"}')[0] == 201
    status, _, issued = server.call("POST", "/api/v1/keys", body=b'{"project": "acme/ml/chat", "name": "k"}')
    assert status == 201
    deadline = time.monotonic() + 5
    while scrape(server)["llmgw_snapshot_keys"] != 1:
        assert time.monotonic() < deadline, "the snapshot gauge never showed the key"
        time.sleep(0.05)
    text = server.call("GET", "/metrics", token=None)[2]
    for secret in (issued["key"], server.admin_token, server.gateway_token, "acme"):
        assert secret not in text


def _lease(server: Server, gateway: str, *asks: wire.LeaseAsk) -> list[wire.LeaseGrant]:
    status, _, body = server.call("POST", "/internal/v1/leases", "gateway",
                                  msgspec.json.encode(wire.LeaseRequest(gateway_id=gateway, asks=list(asks))),
                                  {"content-type": "application/json"})
    assert status == 200, body
    return msgspec.convert(body, wire.LeaseReply).grants


def test_metrics_say_what_the_limits_authority_granted_and_refused(server: Server) -> None:
    before = scrape(server)
    assert before['llmgw_limit_refusals_total{limit="rpm"}'] == 0
    assert before["llmgw_limit_gateways"] == 0
    rpm = wire.Limits(rpm=2)
    one = wire.Limits(concurrency=1)
    first = _lease(server, "gw_a", wire.LeaseAsk(scope="key:k1", limits=rpm, units=5),
                   wire.LeaseAsk(scope="project:p1", limits=one, slots=1))
    assert [(g.units, g.slots, g.denied) for g in first] == [(2, 0, None), (0, 1, None)]
    again = _lease(server, "gw_a", wire.LeaseAsk(scope="key:k1", limits=rpm, units=1))
    other = _lease(server, "gw_b", wire.LeaseAsk(scope="project:p1", limits=one, slots=1))
    assert again[0].denied == "rpm" and other[0].denied == "concurrency"
    got = scrape(server)
    assert got['llmgw_limit_refusals_total{limit="rpm"}'] == 1
    assert got['llmgw_limit_refusals_total{limit="concurrency"}'] == 1
    assert got['llmgw_limit_refusals_total{limit="budget"}'] == 0
    assert got['llmgw_limit_granted_total{kind="units"}'] == 2
    assert got['llmgw_limit_granted_total{kind="slots"}'] == 1
    assert got["llmgw_limit_slots_held"] == 1
    assert (got["llmgw_limit_scopes"], got["llmgw_limit_gateways"]) == (2, 2)
    assert got["llmgw_limit_slots_reclaimed_total"] == 0
    # Scope names (key and project ids) are never labels.
    assert not any("k1" in name or "p1" in name for name in got)
