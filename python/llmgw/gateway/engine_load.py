"""Reading an engine's load from its Prometheus `/metrics` (vLLM's metric names).

The `scored` routing policy weighs queue depth and KV-cache use that only the
engine knows; vLLM, SGLang (with vLLM-compatible names) and the simulator all
expose them. Values of several label sets (one per model name) are summed,
except the cache use, which is a fraction and takes the largest.
"""

from __future__ import annotations

from typing import NamedTuple

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, then the old one


class EngineLoad(NamedTuple):
    """An engine's load at one scrape."""

    running: int
    waiting: int
    kv_usage: float


def parse_engine_load(text: str) -> EngineLoad | None:
    """The load in a Prometheus exposition; None when it has none of vLLM's gauges."""
    running = waiting = 0.0
    kv = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if name == RUNNING:
            running += value
            seen = True
        elif name == WAITING:
            waiting += value
            seen = True
        elif name in KV_USAGE:
            kv = max(kv, value)
            seen = True
    if not seen:
        return None
    return EngineLoad(int(running), int(waiting), kv)
