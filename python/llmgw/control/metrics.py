"""The control plane's Prometheus metrics: GET /metrics on the admin listener.

What an operator alerts on: whether this process leads (`sum(llmgw_control_plane_leader)
== 0` is a cluster with no leader), whether usage still arrives and lands
(`llmgw_usage_*`), what the admin API answers (`llmgw_admin_requests_total`), what the
limits authority refuses and hands out (`llmgw_limit_*`), and the fleet as this control
plane sees it (`llmgw_nodes`, `llmgw_replicas`). Counters move
where the work happens; gauges are read from the live state when a scrape asks, so a
standby (which attaches no part) shows its role and its own admin traffic only.

No label carries a secret or a tenant's name: routes are the table's path templates,
models are the catalog's names, and nothing else is free text.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from llmgw.store.usage import IngestResult

    from .limits import LimitsAuthority
    from .server import ControlPlane

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format."""

ACTIVE_FOR = 30.0
"""A gateway that posted usage within this many seconds counts as sending
(`llmgw_usage_gateways`); gateways post several times a second, even when idle."""

# An admin call reads or writes a few rows; an export of a month of usage reads rollups.
_ADMIN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
# One post's transaction: a few hundred records in tens of milliseconds; seconds is trouble.
_INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

ROUTE_UNMATCHED = "unmatched"
"""The `route` label of a request no route of the table matched."""
ROUTE_FORWARDED = "forwarded"
"""The `route` label of a request a standby forwarded to the leader."""


class ControlMetrics:
    """One control plane's registry, and what its parts call as they work."""

    def __init__(self, cp: ControlPlane) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        self.admin_requests = Counter(
            "llmgw_admin_requests", "Answers of the admin listener, by method, route (the route "
            "table's path template) and status code.", ("method", "route", "code"), registry=reg)
        self.admin_seconds = Histogram(
            "llmgw_admin_request_duration_seconds", "Time to answer an admin or internal request (a "
            "gateway's long poll of the snapshot takes as long as it waits).",
            ("method", "route"), buckets=_ADMIN_BUCKETS, registry=reg)
        self.usage_posts = Counter(
            "llmgw_usage_posts", "Usage posts from gateways, by outcome: stored, or failed (the "
            "store did not take it; the gateway keeps it and sends it again).", ("outcome",),
            registry=reg)
        self.usage_records = Counter(
            "llmgw_usage_records", "Usage records in stored posts, by what they did: counted (a "
            "request's final, counted once), corrected (a final replacing an interrupted "
            "record), duplicate (a final already counted, ignored), open (a request still "
            "running).", ("kind",), registry=reg)
        self.ingest_seconds = Histogram(
            "llmgw_usage_ingest_seconds", "Time to store one usage post (its transaction).",
            buckets=_INGEST_BUCKETS, registry=reg)
        self.usage_settled = Counter(
            "llmgw_usage_settled", "Requests left open by a gateway that went silent, counted "
            "as interrupted.", registry=reg)
        self.closed = Counter(
            "llmgw_admin_connections_closed", "Connections to the admin listener closed because "
            "they sent nothing within its header deadline of connecting.", registry=reg)
        self.last_post = 0.0
        """When the last usage post was stored (unix seconds; 0 before the first)."""
        self._gateways: dict[str, float] = {}
        """Gateway id -> when it last posted (monotonic), for `llmgw_usage_gateways`."""
        for c in ("counted", "corrected", "duplicate", "open"):
            self.usage_records.labels(c)
        for o in ("stored", "failed"):
            self.usage_posts.labels(o)
        reg.register(_StateCollector(cp, self))
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)

    def answered(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answer of the admin listener."""
        self.admin_requests.labels(method, route, str(status)).inc()
        self.admin_seconds.labels(method, route).observe(seconds)

    def ingested(self, gateway_id: str, result: IngestResult, seconds: float) -> None:
        """One usage post stored."""
        self.usage_posts.labels("stored").inc()
        self.ingest_seconds.observe(seconds)
        rec = self.usage_records
        rec.labels("counted").inc(result.counted - result.corrected)
        rec.labels("corrected").inc(result.corrected)
        rec.labels("duplicate").inc(result.duplicates)
        rec.labels("open").inc(result.opens)
        self.last_post = time.time()
        self._gateways[gateway_id] = time.monotonic()

    def ingest_failed(self) -> None:
        """One usage post the store did not take."""
        self.usage_posts.labels("failed").inc()

    def settled(self, n: int) -> None:
        """Open requests of silent gateways settled as interrupted."""
        self.usage_settled.inc(n)

    def connections_closed(self, n: int) -> None:
        """Silent connections the admin listener closed (the sweep's thread)."""
        self.closed.inc(n)

    def gateways_sending(self) -> int:
        """Gateways that posted usage in the last `ACTIVE_FOR` seconds (older ones forgotten)."""
        since = time.monotonic() - ACTIVE_FOR
        for gid in [g for g, t in self._gateways.items() if t < since]:
            del self._gateways[gid]
        return len(self._gateways)

    def render(self) -> bytes:
        """The exposition a scrape answers."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges read from the control plane's live state at each scrape."""

    def __init__(self, cp: ControlPlane, owner: ControlMetrics) -> None:
        self._cp = cp
        self._owner = owner

    def collect(self) -> Iterator[Any]:
        cp, owner = self._cp, self._owner
        lead = cp.leadership
        yield GaugeMetricFamily("llmgw_control_plane_leader", "1 while this control plane leads "
                                "(it runs limits, usage settling, snapshots and the fleet), 0 as "
                                "a standby.", value=1 if lead is not None and lead.is_leader else 0)
        yield GaugeMetricFamily("llmgw_usage_gateways", "Gateway workers that posted usage "
                                f"in the last {ACTIVE_FOR:.0f} seconds.", value=owner.gateways_sending())
        yield GaugeMetricFamily("llmgw_usage_last_post_timestamp_seconds", "When the last usage "
                                "post was stored (unix seconds; 0 before the first).", value=owner.last_post)
        snap = cp.snapshots.current if cp.snapshots is not None else None
        if snap is not None:
            yield GaugeMetricFamily("llmgw_snapshot_version", "Version of the key and limit "
                                    "snapshot published to gateways.", value=snap.version)
            yield GaugeMetricFamily("llmgw_snapshot_keys", "API keys in the published snapshot "
                                    "(revoked and expired keys are left out).", value=len(snap.keys))
        if cp.limits is not None:
            yield from _limits(cp.limits)
        fleet = cp.fleet
        if fleet is not None:
            yield from _fleet(fleet)


def _limits(authority: LimitsAuthority) -> Iterator[Any]:
    yield _labelled(CounterMetricFamily("llmgw_limit_refusals", "Lease asks the limits authority "
                                        "refused, by the limit that refused them (rpm, tpm, "
                                        "concurrency, budget): a gateway worker then answers 429 "
                                        "until a later ask is granted.", labels=["limit"]),
                    (([limit], n) for limit, n in sorted(authority.refused.items())))
    yield _labelled(CounterMetricFamily("llmgw_limit_granted", "What the limits authority granted "
                                        "to gateway workers, by kind: request units (rpm), tokens "
                                        "(tpm and budgets), concurrency slots.", labels=["kind"]),
                    (([kind], n) for kind, n in sorted(authority.granted.items())))
    yield CounterMetricFamily("llmgw_limit_slots_reclaimed", "Concurrency slots taken back "
                              "from gateway workers not heard from for reclaim_after seconds.",
                              value=authority.reclaimed)
    yield GaugeMetricFamily("llmgw_limit_slots_held", "Concurrency slots gateway workers hold now, "
                            "over every key and project.",
                            value=sum(sc.slots_held for sc in authority.scopes.values()))
    yield GaugeMetricFamily("llmgw_limit_scopes", "Keys and projects with limits in use (a scope "
                            "idle for a minute is forgotten).", value=len(authority.scopes))
    yield GaugeMetricFamily("llmgw_limit_gateways", "Gateway workers the limits authority "
                            "follows: one is dropped, and its slots reclaimed, at the first "
                            "call after reclaim_after seconds without one of its own.",
                            value=len(authority.gateways))


def _fleet(fleet: Any) -> Iterator[Any]:
    yield _labelled(GaugeMetricFamily("llmgw_nodes", "Nodes, by state and by what an operator set "
                                      "(ready, cordoned, draining).", labels=["state", "admin_state"]),
                    _count((n.state, n.admin_state) for n in fleet.nodes.values()))
    yield _labelled(GaugeMetricFamily("llmgw_replicas", "Replicas, by model and state.",
                                      labels=["model", "state"]),
                    _count((r.model, r.state) for r in fleet.replicas.values()))
    yield _labelled(GaugeMetricFamily("llmgw_replicas_unplaced", "Replicas a model wants that no "
                                      "node can take now.", labels=["model"]),
                    (([model], c) for model, c in sorted(fleet.unplaced.items())))
    yield CounterMetricFamily("llmgw_reconcile_passes", "Reconcile passes of the fleet loop.",
                              value=fleet.passes)


def _labelled(family: GaugeMetricFamily | CounterMetricFamily,
              samples: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily | CounterMetricFamily:
    """`family` with one sample per (label values, value) of `samples`."""
    for values, n in samples:
        family.add_metric(values, n)
    return family


def _count(keys: Iterable[tuple[str, str]]) -> list[tuple[list[str], int]]:
    """How many times each pair of label values occurs, in order of the values."""
    counts: dict[tuple[str, str], int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return [(list(key), c) for key, c in sorted(counts.items())]
