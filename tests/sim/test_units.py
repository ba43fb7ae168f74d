"""In-process unit tests of the simulator's pieces (no server)."""

from __future__ import annotations

import os

import pytest

from llmgw.engines.sim.cache import PrefixCache, block_hash
from llmgw.engines.sim.config import ENV_VAR, SimConfig, from_env, to_env
from llmgw.engines.sim.faults import Fault, FaultError, parse
from llmgw.engines.sim.kv import RecordingSink
from llmgw.engines.sim.metrics import SimMetrics
from llmgw.engines.sim.text import TOKENS, detokenize, embed, generate


def words(n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def text(tokens: list[str]) -> tuple[str, ...]:
    return tuple(tokens)


def test_generation_is_stable_and_seeded() -> None:
    first = generate(0, "hello world", 16)
    generate.cache_clear()
    assert generate(0, "hello world", 16) == first
    assert generate(1, "hello world", 16) != first
    assert generate(0, "hello world!", 16) != first
    assert generate(0, "hello world", 4) == first[:4]
    text = detokenize(first)
    assert text.startswith(" ") and len(text.split()) == 16
    assert all(t.startswith(" ") for t in TOKENS)
    # Pinned: the text must not change across Python runs or processes (blake2b + Random(int)).
    assert detokenize(generate(0, "pinned", 3)) == detokenize(generate(0, "pinned", 3))
    assert embed(0, "a", 8) == embed(0, "a", 8) != embed(0, "b", 8)


def test_prefix_cache_hits_whole_leading_blocks() -> None:
    cache = PrefixCache(block_size=4, capacity=100)
    prompt = words(10)  # two full blocks and a partial one
    assert cache.query(text(prompt)) == (10, 0)
    assert len(cache) == 2
    assert cache.query(text(prompt)) == (10, 8)
    assert cache.query(text([*prompt[:4], "other", *prompt[5:]])) == (10, 4)  # first block only
    assert cache.query(text(words(3))) == (3, 0)  # no full block
    assert (cache.queries, cache.hits) == (10 + 10 + 10 + 3, 12)


def test_prefix_cache_lru_eviction_and_kv_events() -> None:
    sink = RecordingSink()
    cache = PrefixCache(block_size=2, capacity=3, sink=sink)
    a = words(4, "a")  # blocks a0, a1
    b = words(4, "b")  # blocks b0, b1
    cache.query(text(a))
    ha0 = block_hash(0, a[:2])
    ha1 = block_hash(ha0, a[2:])
    assert sink.events == [("stored", ([ha0, ha1], None, sink.events[0][1][2], 2)), ("flush", ())]
    assert len(sink.events[0][1][2]) == 4  # type: ignore[arg-type]
    cache.query(text(a[:2]))  # touch a0 so a1 is the least recently used
    cache.query(text(b))
    hb0 = block_hash(0, b[:2])
    events = [e for e in sink.events if e[0] != "flush"]
    assert events[1][0] == "stored" and events[1][1][0] == [hb0, block_hash(hb0, b[2:])]
    assert events[2] == ("removed", ([ha1],))
    assert len(cache) == 3 and cache.usage == 1.0
    assert cache.query(text(a)) == (4, 2)  # a0 survived, a1 was evicted
    # a1 is stored again with a0 as its parent.
    events = [e for e in sink.events if e[0] != "flush"]
    assert events[3] == ("stored", ([ha1], ha0, events[3][1][2], 2))
    cache.clear()
    assert sink.events[-2:] == [("cleared", ()), ("flush", ())]
    assert len(cache) == 0


def test_fault_parsing() -> None:
    assert parse("fail") == Fault(fail=500)
    assert parse("fail=503") == Fault(fail=503)
    assert parse("hang") == Fault(hang=True)
    assert parse("reset") == Fault(reset_after=0)
    assert parse("slow=20, reset-after=3") == Fault(slow_ms=20.0, reset_after=3)
    assert parse("error-after=2").error_after == 2
    assert parse("hang-after=1").needs_watch
    assert not parse("reset-after=1").needs_watch
    for bad in ("boom", "fail=99", "slow", "slow=x", "hang-after", "reset-after=-1", "hang=1"):
        with pytest.raises(FaultError):
            parse(bad)


def test_config_round_trips_through_env(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SimConfig(models=("a", "b"), itl_ms=2.5, workers=2)
    monkeypatch.setenv(ENV_VAR, to_env(cfg))
    assert from_env() == cfg
    assert not cfg.zero_latency and SimConfig().zero_latency
    monkeypatch.delenv(ENV_VAR)
    assert ENV_VAR not in os.environ and from_env() == SimConfig()
    with pytest.raises(ValueError, match="block-size"):
        SimConfig(block_size=0).validate()


def test_metrics_render_histogram() -> None:
    m = SimMetrics("m", PrefixCache(4, 10))
    m.observe_ttft(0.003)
    m.observe_ttft(5000.0)
    text = m.render().decode()
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.001"} 0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.005"} 1' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="m",le="2560.0"} 1' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 2' in text
    assert 'vllm:time_to_first_token_seconds_count{model_name="m"} 2' in text

