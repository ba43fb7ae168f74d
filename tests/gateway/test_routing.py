"""Routing policies end to end: the decision and its reason are in each request's record."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai

from tests.support.gateway import SYSTEM, TOKENIZER, Gateway, start_sim
from tests.support.procs import Proc
from tests.support.sim import KV_ANY, kv_endpoints


def test_prefix_mode_follows_the_conversation(gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m") as a, start_sim("--model", "m") as b:
        gw = gateway_factory([f"a={a.url}=m", f"b={b.url}=m"], {"routing": {"m": {"policy": "prefix"}}})
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"}]
        r1 = c.chat.completions.create(model="m", messages=turn1, max_tokens=2)
        turn2 = [*turn1, {"role": "assistant", "content": r1.choices[0].message.content},
                 {"role": "user", "content": "a follow-up"}]
        c.chat.completions.create(model="m", messages=turn2, max_tokens=2)
        recs = gw.usage(2)
    first, second = recs
    assert second["replica"] == first["replica"]
    assert first["route"]["policy"] == "prefix" and first["route"]["kind"] == "cache_miss"
    assert second["route"]["kind"] == "cache_hit"
    assert second["route"]["matched"] > len(SYSTEM)
    assert gw.metric("llmgw_routing_decisions_total", model="m", policy="prefix", kind="cache_hit") == 1


def test_bad_routing_setting_is_refused_at_start(gateway_factory: Callable[..., Gateway]) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "llmgw", "gateway", "--endpoint", "a=http://127.0.0.1:1=m",
         "--config", "/dev/stdin"],
        input='gateway: {routing: {m: {policy: "fastest"}}}', capture_output=True, text=True, timeout=30, check=False,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: gateway.routing.m: ")
    assert "policy" in r.stderr


def kv_sim(tokenizer: str) -> tuple[Proc, str, str]:
    proc = start_sim("--model", "m", "--tokenizer", tokenizer, "--kv-events-endpoint", KV_ANY,
                     "--kv-replay-endpoint", KV_ANY)
    return (proc, *kv_endpoints(proc))


def test_kv_mode_routes_a_shared_prefix_to_the_replica_that_holds_it(
    gateway_factory: Callable[..., Gateway],
) -> None:
    (a, a_pub, a_rep), (b, b_pub, b_rep) = kv_sim(TOKENIZER), kv_sim(TOKENIZER)
    with a, b:
        gw = gateway_factory([], {
            "endpoints": [
                {"id": "a", "url": a.url, "models": ["m"], "kv_events": a_pub, "kv_replay": a_rep},
                {"id": "b", "url": b.url, "models": ["m"], "kv_events": b_pub, "kv_replay": b_rep},
            ],
            "routing": {"m": {"policy": "kv", "tokenizer": TOKENIZER}},
        })
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"}]
        r1 = c.chat.completions.create(model="m", messages=turn1, max_tokens=2)
        # The replica publishes the blocks it stored; wait until the gateway indexed them.
        deadline = time.monotonic() + 10
        while gw.metric("llmgw_kv_index_blocks") == 0:
            assert time.monotonic() < deadline, "no KV event reached the gateway's index"
            time.sleep(0.05)
        turn2 = [*turn1, {"role": "assistant", "content": r1.choices[0].message.content},
                 {"role": "user", "content": "a follow-up"}]
        c.chat.completions.create(model="m", messages=turn2, max_tokens=2)
        first, second = gw.usage(2)
    assert first["route"]["policy"] == "kv" and first["route"]["kind"] == "cache_miss"
    assert second["replica"] == first["replica"]
    assert second["route"]["policy"] == "kv" and second["route"]["kind"] == "cache_hit"
    assert second["route"]["unit"] == "tokens" and second["route"]["matched"] >= 16
    holder = {c["index"]: c["matched"] for c in second["route"]["candidates"]}
    assert min(holder.values()) == 0  # the other replica holds nothing of it


def test_kv_mode_without_a_tokenizer_falls_back_and_says_so(gateway_factory: Callable[..., Gateway]) -> None:
    with start_sim("--model", "m") as a:
        gw = gateway_factory([f"a={a.url}=m"], {"routing": {"m": {"policy": "kv"}}})
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        rec = gw.usage(1)[0]
    assert rec["route"]["policy"] == "prefix" and "tokenizer" in rec["route"]["fallback"]
    assert "configured policy kv runs as prefix" in gw.proc.output
