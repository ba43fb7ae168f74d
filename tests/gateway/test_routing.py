"""Routing policies end to end: the decision and its reason are in each request's record."""

from __future__ import annotations

from collections.abc import Callable

import openai

from .conftest import Gateway, start_sim

SYSTEM = "You are a careful assistant. " * 40


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
