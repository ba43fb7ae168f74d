"""The prefix cache seen from outside: a cached prompt prefills faster."""

from __future__ import annotations

import time

from tests.support.sim import StartSim, client_for, metric


def test_prefix_cache_hit_shortens_ttft(start_sim: StartSim) -> None:
    # 2 ms per uncached prompt token: 256 tokens cost ~0.5 s the first time, ~0 after.
    proc = start_sim("--ttft-ms", "0", "--prefill-us-per-token", "2000", "--block-size", "16")
    prompt = " ".join(f"word{i}" for i in range(256))
    timings = []
    with client_for(proc) as client:
        for _ in range(2):
            start = time.perf_counter()
            resp = client.completions.create(model="sim-model", prompt=prompt, max_tokens=1)
            timings.append(time.perf_counter() - start)
            assert resp.usage is not None and resp.usage.prompt_tokens == 256
    assert timings[0] >= 0.45
    assert timings[1] < timings[0] / 3
    assert metric(proc, "vllm:prefix_cache_queries_total") == 512
    assert metric(proc, "vllm:prefix_cache_hits_total") == 256
    assert metric(proc, "vllm:kv_cache_usage_perc") == 16 / 4096
    assert metric(proc, "vllm:time_to_first_token_seconds_count") == 2
