"""The gateway's Prometheus metrics, defined in one table and rendered on scrape.

Label children are cached per (model, status) so that a request pays a dict
lookup and an increment, not prometheus_client's label validation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Latency buckets for an LLM gateway span both a sub-millisecond relay of a cached
# answer and a minutes-long generation.
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# name -> (type, help, labels)
TABLE: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "llmgw_requests_total": (Counter, "Requests answered, by model asked for and outcome.", ("model", "status")),
    "llmgw_request_duration_seconds": (Histogram, "Time from request to the end of the answer.", ("model",)),
    "llmgw_time_to_first_token_seconds": (Histogram, "Time from request to the first generated token.", ("model",)),
    "llmgw_tokens_total": (Counter, "Tokens counted from upstream usage, by kind (prompt or completion).", ("model", "kind")),
    "llmgw_upstream_retries_total": (Counter, "Requests retried on another replica before the first byte.", ("model",)),
    "llmgw_upstream_retries_refused_total": (Counter, ("Retries not made because the worker's retry budget "
                                              "was spent (the failure went to the client)."), ("model",)),
    "llmgw_replica_ejections_total": (Counter, "Passive ejections of a replica after a connect error or 5xx.", ("replica",)),
    "llmgw_scale_from_zero_waits_total": (Counter, ("Requests held for a model with no replica, by how "
                                          "the wait ended (ready, timeout, gone, refused)."), ("model", "outcome")),
}


class _ReplicaCollector(Collector):
    """In-flight and health per replica, read from the router at scrape time."""

    def __init__(self, snapshot: Callable[[], list[tuple[str, int, bool]]],
                 decisions: Callable[[], dict[str, int]], owner: Metrics) -> None:
        self._snapshot = snapshot
        self._decisions = decisions
        self._owner = owner

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        inflight = GaugeMetricFamily("llmgw_replica_in_flight", "Requests outstanding on a replica.", labels=["replica"])
        healthy = GaugeMetricFamily("llmgw_replica_healthy", "1 when the replica is routed to.", labels=["replica"])
        for rid, n, ok in self._snapshot():
            inflight.add_metric([rid], n)
            healthy.add_metric([rid], 1 if ok else 0)
        yield inflight
        yield healthy
        # Counted in Rust per decision; keys are "model|policy|kind".
        routed = CounterMetricFamily("llmgw_routing_decisions", "Routing decisions by model, policy used and kind "
                                     "(cache_hit, cache_miss, guarded, least_load, ...).", labels=["model", "policy", "kind"])
        for key, n in self._decisions().items():
            model, policy, kind = key.split("|", 2)
            routed.add_metric([model, policy, kind], n)
        yield routed
        stats = self._owner.kv_stats
        if stats is not None:
            st = stats()
            yield GaugeMetricFamily("llmgw_kv_index_blocks", "Blocks in this worker's KV-event index.",
                                    value=st.get("blocks", 0))
            events = CounterMetricFamily("llmgw_kv_index_batches", "KV-event batches applied, and sequence "
                                         "gaps and engine restarts seen.", labels=["what"])
            for what in ("batches", "gaps", "restarts", "duplicates", "malformed"):
                events.add_metric([what], st.get(what, 0))
            yield events


class Metrics:
    """The metrics of one gateway worker."""

    def __init__(self, replicas: Callable[[], list[tuple[str, int, bool]]],
                 decisions: Callable[[], dict[str, int]]) -> None:
        self.kv_stats: Callable[[], dict[str, int]] | None = None
        """The KV-event index's counters, when the worker has one."""
        self.registry = CollectorRegistry(auto_describe=False)
        made: dict[str, Counter | Histogram] = {}
        for name, (cls, doc, labels) in TABLE.items():
            # prometheus_client appends _total to counters itself.
            base = name.removesuffix("_total") if cls is Counter else name
            if cls is Histogram:
                made[name] = Histogram(base, doc, labels, registry=self.registry, buckets=_LATENCY)
            else:
                made[name] = cls(base, doc, labels, registry=self.registry)
        self.registry.register(_ReplicaCollector(replicas, decisions, self))
        self._replica_registry = CollectorRegistry(auto_describe=False)
        self._replica_registry.register(_ReplicaCollector(replicas, decisions, self))
        self._requests = made["llmgw_requests_total"]
        self._duration = made["llmgw_request_duration_seconds"]
        self._ttft = made["llmgw_time_to_first_token_seconds"]
        self._tokens = made["llmgw_tokens_total"]
        self._retries = made["llmgw_upstream_retries_total"]
        self._ejections = made["llmgw_replica_ejections_total"]
        self._retries_refused = made["llmgw_upstream_retries_refused_total"]
        self._waits = made["llmgw_scale_from_zero_waits_total"]
        self._children: dict[tuple[str, ...], object] = {}
        self._per_request: dict[tuple[str, str], tuple[Counter | Histogram, ...]] = {}
        """(model, status) -> the five children `request` updates."""

    def _child(self, metric: Counter | Histogram, *labels: str) -> Counter | Histogram:
        key = (metric._name, *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c  # type: ignore[return-value]

    def request(self, model: str, status: str, duration: float, ttft: float | None, prompt: int, completion: int) -> None:
        """Counts one finished request."""
        # Every child a request touches, found with one lookup (five `_child` calls, each
        # building its key, were a third of this call's 2.8 µs).
        kids = self._per_request.get((model, status))
        if kids is None:
            kids = self._per_request[(model, status)] = (
                self._child(self._requests, model, status), self._child(self._duration, model),
                self._child(self._ttft, model), self._child(self._tokens, model, "prompt"),
                self._child(self._tokens, model, "completion"))
        count, took, first, prompt_tokens, completion_tokens = kids
        count.inc()  # type: ignore[union-attr]
        took.observe(duration)  # type: ignore[union-attr]
        if ttft is not None:
            first.observe(ttft)  # type: ignore[union-attr]
        if prompt:
            prompt_tokens.inc(prompt)  # type: ignore[union-attr]
        if completion:
            completion_tokens.inc(completion)  # type: ignore[union-attr]

    def retry(self, model: str) -> None:
        """Counts a retry on another replica."""
        self._child(self._retries, model).inc()  # type: ignore[union-attr]

    def retry_refused(self, model: str) -> None:
        """Counts a retry the retry budget did not allow."""
        self._child(self._retries_refused, model).inc()  # type: ignore[union-attr]

    def ejection(self, replica: str) -> None:
        """Counts a passive ejection."""
        self._child(self._ejections, replica).inc()  # type: ignore[union-attr]

    def woken(self, model: str, outcome: str) -> None:
        """Counts one request that waited for a replica of its model."""
        self._child(self._waits, model, outcome).inc()  # type: ignore[union-attr]

    def render(self) -> bytes:
        """The Prometheus text exposition.

        With several workers (PROMETHEUS_MULTIPROC_DIR set), counters and
        histograms are summed over every worker's files; the replica gauges are
        this worker's view.
        """
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            merged = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged) + generate_latest(self._replica_registry)
        return generate_latest(self.registry)
