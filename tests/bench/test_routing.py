"""The routing scenario's logic: the workload, the oracle, the maths and the result format.

No load runs here: no server is started.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
from bench.oracle import MirrorCache, Oracle, pick, sim_tokenizer
from bench.report import Machine, Result, Target
from bench.routing_report import (
    RoutingResult,
    RoutingRound,
    cache_deltas,
    figures_and_checks,
    fold,
    imbalance,
    markdown,
    ratio,
    table,
)
from bench.routing_stack import (
    TOKENIZER,
    Fleet,
    FleetSpec,
    gateway_config,
    parse_metrics,
    route_kinds,
)
from bench.sessions import ByReplica, run_sessions
from bench.workload import WorkloadSpec, build, messages

from tests.bench.test_harness import _res

SMALL = WorkloadSpec(
    users=6, turns=4, turns_spread=0, tenant_skew=0, system_prompts=2, system_words=40
)


def test_workload_is_deterministic_and_seeded() -> None:
    a, b = build(SMALL), build(SMALL)
    assert a.bodies == b.bodies and a.systems == b.systems
    assert build(WorkloadSpec(**{**SMALL.__dict__, "seed": 8})).bodies != a.bodies
    assert a.requests == 6 * 4


def test_each_turn_extends_the_previous_one_and_users_share_system_prompts() -> None:
    w = build(SMALL)
    for u, turns in enumerate(w.bodies):
        convo = [messages(b) for b in turns]
        assert convo[0][0] == {"role": "system", "content": w.systems[w.user_system[u]]}
        for k in range(1, len(convo)):
            # turn k+1 = turn k + the assistant's reply + a new user message
            assert convo[k][: len(convo[k - 1])] == convo[k - 1]
            assert [m["role"] for m in convo[k][len(convo[k - 1]) :]] == ["assistant", "user"]
    assert w.user_system == [0, 1, 0, 1, 0, 1]
    assert len(set(w.systems)) == 2
    # Different users never send the same turn, even under the same system prompt.
    firsts = [messages(t[0])[1]["content"] for t in w.bodies]
    assert len(set(firsts)) == len(firsts)


def test_default_workload_is_uneven_as_real_tenants_and_chats_are() -> None:
    spec = WorkloadSpec(system_words=5, user_words=2, reply_words=2)
    w = build(spec)
    per_user = [len(t) for t in w.bodies]
    assert min(per_user) >= spec.turns - spec.turns_spread
    assert max(per_user) <= spec.turns + spec.turns_spread
    assert len(set(per_user)) > 1
    tenants = [w.user_system.count(i) for i in range(spec.system_prompts)]
    # Zipf: prompt 0 is the busiest, well above an equal share.
    assert tenants[0] == max(tenants) and tenants[0] > 2 * spec.users / spec.system_prompts
    with pytest.raises(ValueError):
        build(WorkloadSpec(tenant_skew=-1))


def test_shared_prefixes_hold_in_tokens_too() -> None:
    tok = sim_tokenizer(TOKENIZER)
    w = build(SMALL)
    t1, t2 = tok(w.bodies[0][0]), tok(w.bodies[0][1])
    assert t2[: len(t1) - 4] == t1[: len(t1) - 4]  # all but the generation prompt's tail
    other_user = tok(w.bodies[2][0])  # same system prompt
    other_system = tok(w.bodies[1][0])
    common = next(i for i, (x, y) in enumerate(zip(t1, other_user, strict=False)) if x != y)
    assert common > 16 * 4  # the system prompt's blocks are shared
    # Distinct system prompts differ within the first cache block (16 tokens).
    assert next(i for i, (x, y) in enumerate(zip(t1, other_system, strict=False)) if x != y) < 16


def _bytes_tokens(body: bytes) -> tuple[int, ...]:
    return tuple(body)


def test_peek_counts_the_cached_prefix_without_touching_the_cache() -> None:
    c = MirrorCache(4, 100)
    c.query(tuple(b"abcdefgh"))
    assert (c.queries, c.hits) == (8, 0)
    assert c.peek(tuple(b"abcdefghij")) == 8
    assert c.peek(tuple(b"abcdXXXX")) == 4
    assert c.peek(tuple(b"Xbcdefgh")) == 0
    assert (c.queries, c.hits, len(c)) == (8, 0, 2)


def test_pick_prefers_longest_match_then_outstanding_then_held_then_index() -> None:
    assert pick([0, 32, 16], [0, 9, 0], [0, 0, 0]) == 1
    assert pick([16, 16, 0], [3, 1, 0], [0, 0, 0]) == 1
    assert pick([0, 0, 0], [1, 1, 1], [5, 2, 2]) == 1
    assert pick([0, 0], [0, 0], [0, 0]) == 0


def test_oracle_routes_to_the_longest_cached_prefix() -> None:
    o = Oracle(3, 4, 100, _bytes_tokens)
    a = o.route(b"AAAAaaaa")  # cold: replica 0
    b = o.route(b"BBBBbbbb")  # cold again, 0 is busy: another replica
    assert a == 0 and b == 1
    o.release(a)
    o.release(b)
    assert o.route(b"BBBBbbbbcccc") == 1  # its prefix is on 1
    assert o.route(b"AAAAaaaaBBBB") == 0
    assert o.route(b"CCCC") == 2  # new prefix: the replica holding least
    assert o.sent == [2, 2, 1] and o.outstanding == [1, 1, 1]
    assert o.hits == 16 and o.queries == 8 + 8 + 12 + 12 + 4


def test_by_replica_maps_ports_and_releases() -> None:
    o = Oracle(2, 4, 10, _bytes_tokens)
    r = ByReplica([9001, 9002], o.route, o.release)
    assert r.route(b"xxxx") == 9001 and r.route(b"yyyy") == 9002
    r.release(9002)
    assert o.outstanding == [1, 0]


def test_sessions_refuse_an_unbounded_run() -> None:
    import asyncio

    o = Oracle(1, 4, 10, _bytes_tokens)
    with pytest.raises(ValueError, match="stop by itself"):
        asyncio.run(
            run_sessions(
                build(SMALL), ByReplica([1], o.route, o.release), concurrency=2, duration=0
            )
        )


def test_imbalance_and_ratio() -> None:
    assert imbalance([5, 5, 7, 7]) == pytest.approx(1.4)
    assert imbalance([8, 8, 8, 8]) == 1.0
    assert imbalance([0, 3]) == math.inf
    assert math.isnan(imbalance([])) and math.isnan(imbalance([0, 0]))
    assert ratio(1.0, 2.0) == 0.5
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(math.nan, 1.0) is None


METRICS = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
vllm:prefix_cache_queries_total{model_name="sim-model"} 1000
vllm:prefix_cache_hits_total{model_name="sim-model"} 640
vllm:request_success_total{model_name="sim-model",finished_reason="stop"} 3
vllm:request_success_total{model_name="sim-model",finished_reason="length"} 7
vllm:num_requests_running{model_name="sim-model"} 2
"""


def test_metrics_are_parsed_and_differenced() -> None:
    m = parse_metrics(METRICS)
    assert m["vllm:request_success_total"] == 10
    assert m["vllm:prefix_cache_hits_total"] == 640
    zero = parse_metrics("")
    reqs, queries, hits = cache_deltas([zero, zero], [m, parse_metrics(METRICS.replace("7", "1"))])
    assert reqs == [10, 4] and queries == 2000 and hits == 1280


def test_the_simulators_own_metrics_parse() -> None:
    from llmgw.engines.sim.cache import PrefixCache
    from llmgw.engines.sim.metrics import SimMetrics

    cache = PrefixCache(4, 10)
    cache.query(tuple(range(8)))
    cache.query(tuple(range(8)))
    m = SimMetrics("sim-model", cache)
    m.finished["length"] = 2
    got = parse_metrics(m.render().decode())
    assert got["vllm:prefix_cache_queries_total"] == 16
    assert got["vllm:prefix_cache_hits_total"] == 8
    assert got["vllm:request_success_total"] == 2


def test_only_kv_gets_events_and_the_tokenizer(tmp_path: Path) -> None:
    from bench.procs import Server

    fleet = Fleet(FleetSpec(replicas=2))
    for i in range(2):  # stand-ins, never started
        srv = Server.__new__(Server)
        srv.url, srv.port = f"http://127.0.0.1:{9000 + i}", 9000 + i
        from bench.routing_stack import Replica

        fleet.replicas.append(
            Replica(srv, f"tcp://127.0.0.1:{7000 + i}", f"tcp://127.0.0.1:{8000 + i}")
        )
    kv = gateway_config(fleet, "kv", tmp_path / "u.jsonl")["gateway"]
    pf = gateway_config(fleet, "prefix", tmp_path / "u.jsonl")["gateway"]
    assert isinstance(kv, dict) and isinstance(pf, dict)
    assert kv["endpoints"][1]["kv_events"] == "tcp://127.0.0.1:7001"
    assert kv["routing"]["sim-model"] == {"policy": "kv", "tokenizer": TOKENIZER}
    assert "kv_events" not in pf["endpoints"][0]
    assert pf["routing"]["sim-model"] == {"policy": "prefix"}
    # llmgw's own validation accepts it
    from llmgw.config.file import ServerFile

    msgspec.convert({"gateway": kv}, ServerFile, strict=True)


def test_route_kinds_from_the_usage_log(tmp_path: Path) -> None:
    log = tmp_path / "usage.jsonl"
    log.write_text(
        '{"route": {"kind": "cache_hit"}}\n{"route": {"kind": "cache_miss"}}\n'
        '{"route": {"kind": "cache_hit"}}\nnot json\n{}\n'
    )
    assert route_kinds(log) == {"cache_hit": 2, "cache_miss": 1, "?": 1}
    assert route_kinds(tmp_path / "absent") == {}


def _round(target: str, r: int, hit: float, ttft_p90: float, reqs: list[int]) -> RoutingRound:
    res = _res(10.0)
    res.ttft_ms = {"p50": ttft_p90 / 2, "p90": ttft_p90, "p99": ttft_p90}
    return RoutingRound(
        round=r, target=target, concurrency=16, stream=True, result=res, server_cpu=None,
        server_rss_mb=None, upstream_cpu=0.5, replica_requests=reqs, prompt_tokens=1000,
        hit_tokens=int(hit * 1000), hit_ratio=hit, imbalance=imbalance(reqs),
    )  # fmt: skip


def _result() -> RoutingResult:
    rounds = []
    for r in (1, 2, 3):
        rounds += [
            _round("oracle", r, 0.80, 50, [8, 8, 8, 8]),
            _round("llmgw-round_robin", r, 0.40, 400 + r, [8, 8, 8, 8]),
            _round("llmgw-prefix", r, 0.70, 70, [7, 8, 8, 9]),
            _round("llmgw-kv", r, 0.78, 60, [6, 8, 8, 10]),
            _round("vllm-router", r, 0.50, 200, [0, 10, 11, 11] if r == 1 else [8, 8, 8, 8]),
        ]
    order = ["oracle", "llmgw-round_robin", "llmgw-prefix", "llmgw-kv", "vllm-router"]
    summary = fold(rounds, order)
    figures, checks = figures_and_checks(summary)
    return RoutingResult(
        scenario="routing", date="2026-01-01", started_at="s", finished_at="f", command="c",
        machine=Machine(nproc=2, cpu_model="x", python="3", platform="p", loadavg_start=[1.0]),
        versions={}, settings={"rounds": 3}, targets=[Target(name="oracle", kind="oracle", version="v", command=[])],
        rounds=rounds, summary=summary, void=False, void_reason="", figures=figures, checks=checks,
    )  # fmt: skip


def test_figures_are_ratios_of_medians_with_verdicts() -> None:
    res = _result()
    f = res.figures
    assert f["kv_over_oracle_hit_ratio"] == pytest.approx(0.78 / 0.80)
    assert f["prefix_over_oracle_hit_ratio"] == pytest.approx(0.70 / 0.80)
    assert f["round_robin_over_kv_ttft_p90"] == pytest.approx(402 / 60)
    assert f["llmgw_kv_imbalance"] == pytest.approx(10 / 6)
    assert f["vllm_router_imbalance"] == 1.0  # median over rounds: one starved round is inf
    assert f["prefix_over_vllm_router_hit_ratio"] == pytest.approx(0.7 / 0.5)
    verdict = {c.name: c.met for c in res.checks}
    assert verdict == {
        "kv_over_oracle_hit_ratio": True,
        "prefix_over_oracle_hit_ratio": True,
        "round_robin_over_kv_ttft_p90": True,
        "llmgw_kv_imbalance": False,
        "llmgw_prefix_imbalance": True,
        "prefix_over_vllm_router_hit_ratio": True,
        "vllm_router_over_prefix_ttft_p90": True,
    }
    _, checks = figures_and_checks([r for r in res.summary if r.target != "oracle"])
    assert {c.name: c.met for c in checks}["kv_over_oracle_hit_ratio"] is None


def test_result_round_trips_and_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = _result()
    raw = msgspec.json.encode(res)
    back = msgspec.json.decode(raw, type=RoutingResult)
    assert isinstance(back.rounds[0], RoutingRound) and back.checks == res.checks
    starved = next(r for r in back.rounds if r.target == "vllm-router" and r.round == 1)
    assert starved.imbalance is None  # inf is null in JSON
    plain = msgspec.json.decode(raw, type=Result)  # the harness's reader still reads it
    assert plain.scenario == "routing" and len(plain.rounds) == 15
    assert "kv_over_oracle_hit_ratio" in table(res) and "| `llmgw_kv_imbalance` |" in markdown(back)
    path = tmp_path / "routing.json"
    path.write_bytes(raw)
    from bench.__main__ import main

    assert main(["table", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**routing**") and "| llmgw-kv | 3 |" in out
