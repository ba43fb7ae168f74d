"""The gateway's Prometheus metrics, defined in one table and rendered on scrape.

Label children are cached per (model, status) so that a request pays a dict
lookup and an increment, not prometheus_client's label validation. In a worker that
is the only one (no PROMETHEUS_MULTIPROC_DIR), a finished request is only tallied in
plain numbers, and the tallies go into prometheus_client's values when a scrape asks:
its locked values cost 1.9 µs a request, the tally about a quarter of that. With several
workers the values live in shared files that any worker's scrape reads, so each request
goes into them at once.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Latency buckets for an LLM gateway span both a sub-millisecond relay of a cached
# answer and a minutes-long generation.
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BOUNDS = (*_LATENCY, math.inf)
"""Each histogram bucket's upper bound, +Inf last, as prometheus_client keeps them: a value
goes in the first bucket whose bound is at least the value (`bisect_left`)."""


class _Tally:
    """A (model, status)'s finished requests since the last scrape, in plain numbers."""

    __slots__ = ("completion", "count", "first", "first_sum", "prompt", "took", "took_sum")

    def __init__(self) -> None:
        self.count = 0
        self.took_sum = 0.0
        self.took = [0] * len(_BOUNDS)
        self.first_sum = 0.0
        self.first = [0] * len(_BOUNDS)
        self.prompt = 0
        self.completion = 0

# name -> (type, help, labels)
TABLE: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "llmgw_requests_total": (Counter, "Requests answered, by model asked for and outcome.", ("model", "status")),
    "llmgw_request_duration_seconds": (Histogram, "Time from request to the end of the answer.", ("model",)),
    "llmgw_time_to_first_token_seconds": (Histogram, "Time from request to the first generated token.", ("model",)),
    "llmgw_tokens_total": (Counter, "Tokens counted from upstream usage, by kind (prompt or completion).",
                           ("model", "kind")),
    "llmgw_upstream_retries_total": (Counter, "Requests retried on another replica before the first byte.", ("model",)),
    "llmgw_upstream_retries_refused_total": (Counter, ("Retries not made because the worker's retry budget "
                                              "was spent (the failure went to the client)."), ("model",)),
    "llmgw_replica_ejections_total": (Counter, "Passive ejections of a replica after a connect error or 5xx.",
                                      ("replica",)),
    "llmgw_replica_ejections_spared_total": (Counter, ("Connect errors and 5xx that did not eject their replica: "
                                             "health.max_ejection_percent of one of its models' replicas "
                                             "were out of routing already."), ("replica",)),
    "llmgw_scale_from_zero_waits_total": (Counter, ("Requests held for a model with no replica, by how "
                                          "the wait ended (ready, timeout, gone, refused)."), ("model", "outcome")),
    "llmgw_client_connections_closed_total": (Counter, ("Client connections the gateway closed, by why: silent (no "
                                              "byte within timeouts.client_headers of connecting), stalled (a "
                                              "streamed answer unread for timeouts.client_idle)."), ("reason",)),
    "llmgw_usage_records_dropped_total": (Counter, ("Usage records the gateway gave up on, by why: backlog "
                                          "(usage_max_pending records were waiting for the control plane), "
                                          "refused (the control plane refused their post as invalid), "
                                          "shutdown (still unsent when the worker stopped)."), ("reason",)),
    "llmgw_usage_post_failures_total": (Counter, ("Usage posts the control plane did not take (unreachable, or it "
                                        "answered an error); their records are kept and sent again."), ()),
    "llmgw_usage_pending_records": (Gauge, ("Usage records (running and finished requests) waiting to be posted to "
                                    "the control plane, as of the last post."), ()),
    "llmgw_usage_pending_records_max": (Gauge, ("usage_max_pending: past this many waiting records, new ones are "
                                        "dropped."), ()),
}


class _ReplicaCollector(Collector):
    """In-flight and health per replica, read from the router at scrape time."""

    def __init__(self, snapshot: Callable[[], list[tuple[str, int, bool]]],
                 decisions: Callable[[], dict[str, int]], owner: Metrics) -> None:
        self._snapshot = snapshot
        self._decisions = decisions
        self._owner = owner

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        inflight = GaugeMetricFamily("llmgw_replica_in_flight", "Requests outstanding on a replica.",
                                     labels=["replica"])
        healthy = GaugeMetricFamily("llmgw_replica_healthy", "1 when the replica is routed to.", labels=["replica"])
        for rid, n, ok in self._snapshot():
            inflight.add_metric([rid], n)
            healthy.add_metric([rid], 1 if ok else 0)
        yield inflight
        yield healthy
        # Counted in Rust per decision; keys are "model|policy|kind".
        routed = CounterMetricFamily("llmgw_routing_decisions", "Routing decisions by model, policy used and kind "
                                     "(cache_hit, cache_miss, guarded, least_load, ...).",
                                     labels=["model", "policy", "kind"])
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
        gauges: dict[str, Gauge] = {}
        for name, (cls, doc, labels) in TABLE.items():
            # prometheus_client appends _total to counters itself.
            base = name.removesuffix("_total") if cls is Counter else name
            if cls is Histogram:
                made[name] = Histogram(base, doc, labels, registry=self.registry, buckets=_LATENCY)
            elif cls is Gauge:
                # With several workers, the sum over the live ones.
                gauges[name] = Gauge(base, doc, labels, registry=self.registry, multiprocess_mode="livesum")
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
        self._spared = made["llmgw_replica_ejections_spared_total"]
        self._retries_refused = made["llmgw_upstream_retries_refused_total"]
        self._waits = made["llmgw_scale_from_zero_waits_total"]
        self._closed = made["llmgw_client_connections_closed_total"]
        self._usage_dropped = made["llmgw_usage_records_dropped_total"]
        self._usage_failures = made["llmgw_usage_post_failures_total"]
        self._usage_pending = gauges["llmgw_usage_pending_records"]
        self._usage_pending_max = gauges["llmgw_usage_pending_records_max"]
        self._children: dict[tuple[str, ...], object] = {}
        self._per_request: dict[tuple[str, str], tuple[Counter | Histogram, ...]] = {}
        """(model, status) -> the five children `request` updates."""
        self._shared = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        """Several workers: the values are files that any worker's scrape reads."""
        if self._shared:
            forget_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        self._tallies: dict[tuple[str, str], _Tally] | None = None if self._shared else {}
        """(model, status) -> what finished since the last scrape; None: each request is
        written to the shared values at once (several workers)."""

    def _child(self, metric: Counter | Histogram, *labels: str) -> Counter | Histogram:
        key = (metric._name, *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c  # type: ignore[return-value]

    def request(self, model: str, status: str, duration: float, ttft: float | None, prompt: int,
                completion: int) -> None:
        """Counts one finished request."""
        tallies = self._tallies
        if tallies is None:
            return self._request_now(model, status, duration, ttft, prompt, completion)
        t = tallies.get((model, status))
        if t is None:
            t = tallies[(model, status)] = _Tally()
        t.count += 1
        t.took_sum += duration
        t.took[bisect_left(_BOUNDS, duration)] += 1
        if ttft is not None:
            t.first_sum += ttft
            t.first[bisect_left(_BOUNDS, ttft)] += 1
        t.prompt += prompt
        t.completion += completion
        return None

    def _settle(self) -> None:
        """Moves the tallies into prometheus_client's values (before a scrape reads them)."""
        if not self._tallies:
            return
        tallies, self._tallies = self._tallies, {}
        for (model, status), t in tallies.items():
            count, took, first, prompt_tokens, completion_tokens = self._children_of(model, status)
            count.inc(t.count)  # type: ignore[union-attr]
            _add_observed(took, t.took_sum, t.took)
            if any(t.first):
                _add_observed(first, t.first_sum, t.first)
            if t.prompt:
                prompt_tokens.inc(t.prompt)  # type: ignore[union-attr]
            if t.completion:
                completion_tokens.inc(t.completion)  # type: ignore[union-attr]

    def _children_of(self, model: str, status: str) -> tuple[Counter | Histogram, ...]:
        kids = self._per_request.get((model, status))
        if kids is None:
            kids = self._per_request[(model, status)] = (
                self._child(self._requests, model, status), self._child(self._duration, model),
                self._child(self._ttft, model), self._child(self._tokens, model, "prompt"),
                self._child(self._tokens, model, "completion"))
        return kids

    def _request_now(self, model: str, status: str, duration: float, ttft: float | None, prompt: int,
                     completion: int) -> None:
        # Every child a request touches, found with one lookup (five `_child` calls, each
        # building its key, were a third of this call's 2.8 µs).
        count, took, first, prompt_tokens, completion_tokens = self._children_of(model, status)
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

    def ejection_spared(self, replica: str) -> None:
        """Counts a failure that did not eject its replica (`max_ejection_percent`)."""
        self._child(self._spared, replica).inc()  # type: ignore[union-attr]

    def woken(self, model: str, outcome: str) -> None:
        """Counts one request that waited for a replica of its model."""
        self._child(self._waits, model, outcome).inc()  # type: ignore[union-attr]

    def connections_closed(self, reason: str, n: int = 1) -> None:
        """Counts client connections the gateway closed (`reason`: silent or stalled); any thread."""
        self._child(self._closed, reason).inc(n)  # type: ignore[union-attr]

    # -- usage shipping (`usage.UsageSink`, a post at a time) ---------------------------
    def usage_dropped(self, reason: str, n: int) -> None:
        """Counts usage records given up on (`reason`: backlog, refused or shutdown)."""
        self._child(self._usage_dropped, reason).inc(n)  # type: ignore[union-attr]

    def usage_post_failed(self) -> None:
        """Counts a usage post the control plane did not take (its records are kept)."""
        self._usage_failures.inc()  # type: ignore[union-attr]

    def usage_pending(self, n: int, most: int) -> None:
        """Sets the records waiting for the control plane, and how many may wait."""
        self._usage_pending.set(n)
        self._usage_pending_max.set(most)

    def close(self) -> None:
        """At the worker's stop: with several workers, its gauges leave the sums."""
        if self._shared:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    def render(self) -> bytes:
        """The Prometheus text exposition.

        With several workers (PROMETHEUS_MULTIPROC_DIR set), counters and
        histograms are summed over every worker's files; the replica gauges are
        this worker's view.
        """
        self._settle()
        if self._shared:
            merged = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged) + generate_latest(self._replica_registry)
        return generate_latest(self.registry)


def forget_dead_workers(directory: str) -> None:
    """Drops the gauge files of workers no longer running (one that crashed and was started
    again), so that `livesum` gauges add up the live workers only; counters keep theirs."""
    try:
        names = os.listdir(directory)
    except OSError:
        return  # prometheus_client reports the directory when it first writes there
    for name in names:
        if not name.startswith("gauge_live"):
            continue
        pid = name.rsplit("_", 1)[-1].removesuffix(".db")
        if pid.isdigit() and not _alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), directory)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _add_observed(h: Counter | Histogram, total: float, buckets: list[int]) -> None:
    """Adds tallied observations to a histogram child: what `observe` would have added for each
    (its sum, and one to the first bucket whose bound holds the value). Through the child's
    values, which prometheus_client 0.26 keeps in `_sum` and `_buckets` (one per bound, not
    cumulative); tests/unit/test_metrics.py compares the exposition with `observe`'s."""
    h._sum.inc(total)  # type: ignore[union-attr]
    for value, n in zip(h._buckets, buckets, strict=True):  # type: ignore[union-attr]
        if n:
            value.inc(n)
