"""Engine load from vLLM's Prometheus metrics."""

from __future__ import annotations

from llmgw.gateway.engine_load import EngineLoad, parse_engine_load

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="0",model_name="b"} 1.0
vllm:num_requests_waiting{engine="0",model_name="a"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.5
vllm:prompt_tokens_total{engine="0",model_name="a"} 99.0
"""


def test_sums_requests_and_takes_the_fullest_cache() -> None:
    assert parse_engine_load(VLLM) == EngineLoad(4, 7, 0.5)


def test_older_cache_metric_name() -> None:
    assert parse_engine_load("vllm:gpu_cache_usage_perc 0.75\nvllm:num_requests_waiting 2\n") == EngineLoad(0, 2, 0.75)


def test_no_vllm_metrics() -> None:
    assert parse_engine_load("# nothing\nprocess_cpu_seconds_total 1.0\n") is None
    assert parse_engine_load("vllm:num_requests_running{x=\"1\"} garbage\n") is None
