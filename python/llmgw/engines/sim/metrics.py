"""Engine metrics with vLLM's names, kept as plain ints and rendered on scrape.

Every series carries `model_name` = the first served model, as vLLM labels all
engine metrics with its first served model name. With several granian workers
each worker counts its own requests; a scrape sees the worker that answered it.
"""

from __future__ import annotations

from bisect import bisect_left

from llmgw.engines.sim.cache import PrefixCache

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SimMetrics:
    """Counters and gauges of one simulator worker; `render` writes Prometheus text."""

    def __init__(self, model_name: str, cache: PrefixCache) -> None:
        self.cache = cache
        self._label = '{model_name="' + escape_label(model_name) + '"}'
        self._label_prefix = 'model_name="' + escape_label(model_name) + '"'
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.aborted = 0
        self._ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)  # last slot is +Inf
        self._ttft_sum = 0.0

    def observe_ttft(self, seconds: float) -> None:
        """Record one time to first token."""
        self._ttft_counts[bisect_left(TTFT_BUCKETS, seconds)] += 1
        self._ttft_sum += seconds

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        lab = self._label
        lp = self._label_prefix
        out: list[str] = []

        def head(name: str, kind: str, text: str) -> None:
            out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")

        head("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
        out.append(f"vllm:num_requests_running{lab} {self.running}\n")
        head("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
        out.append(f"vllm:num_requests_waiting{lab} {self.waiting}\n")
        head("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
        out.append(f"vllm:kv_cache_usage_perc{lab} {self.cache.usage!r}\n")
        head("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
        out.append(f"vllm:prompt_tokens_total{lab} {self.prompt_tokens}\n")
        head("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
        out.append(f"vllm:generation_tokens_total{lab} {self.generation_tokens}\n")
        head("vllm:request_success_total", "counter", "Count of successfully processed requests.")
        for reason, n in self.finished.items():
            out.append(f'vllm:request_success_total{{{lp},finished_reason="{reason}"}} {n}\n')
        head("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.")
        out.append(f"vllm:prefix_cache_queries_total{lab} {self.cache.queries}\n")
        head("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.")
        out.append(f"vllm:prefix_cache_hits_total{lab} {self.cache.hits}\n")
        name = "vllm:time_to_first_token_seconds"
        head(name, "histogram", "Histogram of time to first token in seconds.")
        cumulative = 0
        for bound, n in zip(TTFT_BUCKETS, self._ttft_counts, strict=False):
            cumulative += n
            out.append(f'{name}_bucket{{{lp},le="{bound!r}"}} {cumulative}\n')
        cumulative += self._ttft_counts[-1]
        out.append(f'{name}_bucket{{{lp},le="+Inf"}} {cumulative}\n')
        out.append(f"{name}_count{lab} {cumulative}\n")
        out.append(f"{name}_sum{lab} {self._ttft_sum!r}\n")
        head(
            "llmgw_sim_requests_aborted_total",
            "counter",
            "Requests whose client went away before the end (simulator only).",
        )
        out.append(f"llmgw_sim_requests_aborted_total{lab} {self.aborted}\n")
        return "".join(out).encode()


def escape_label(value: str) -> str:
    """A Prometheus label value, escaped as the exposition format asks."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
