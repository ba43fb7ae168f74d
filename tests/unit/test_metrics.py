"""The gateway's metrics (gateway/metrics.py): tallied requests scrape exactly as observed ones."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.gateway import usage
from llmgw.gateway.metrics import Metrics, forget_dead_workers
from llmgw.protocol.wire import UsageRecord

# (model, status, duration, ttft, prompt, completion): bucket bounds exactly, between them,
# past the last one, with and without a first token and tokens.
REQUESTS = [
    ("m", "ok", 0.001, None, 12, 16),
    ("m", "ok", 0.0011, 0.0005, 3, 0),
    ("m", "ok", 400.0, 301.0, 0, 7),
    ("m", "upstream_error", 0.0, None, 0, 0),
    ("other", "ok", 2.5, 0.25, 1, 1),
    ("m", "ok", 0.3, None, 0, 0),
]


def _metrics() -> Metrics:
    return Metrics(list, dict)


def _scrape(m: Metrics) -> list[str]:
    # Without the `_created` lines: each child's creation time differs between two objects.
    return [line for line in m.render().decode().splitlines() if "_created" not in line]


def test_a_tallied_worker_scrapes_what_one_observing_each_request_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    tallied = _metrics()
    observed = _metrics()
    observed._tallies = None  # as with several workers: each request written at once
    for r in REQUESTS:
        tallied.request(*r)
        observed.request(*r)
    assert tallied._tallies  # held back until the scrape
    got = _scrape(tallied)
    assert got == _scrape(observed)
    assert 'llmgw_requests_total{model="m",status="ok"} 4.0' in got
    assert 'llmgw_request_duration_seconds_bucket{le="0.001",model="m"} 2.0' in got
    assert 'llmgw_request_duration_seconds_bucket{le="300.0",model="m"} 4.0' in got
    assert 'llmgw_request_duration_seconds_bucket{le="+Inf",model="m"} 5.0' in got
    assert 'llmgw_time_to_first_token_seconds_count{model="m"} 2.0' in got
    assert 'llmgw_tokens_total{kind="completion",model="m"} 23.0' in got


def test_a_scrape_settles_the_tallies_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    m = _metrics()
    m.request("m", "ok", 0.01, None, 1, 1)
    first = _scrape(m)
    assert _scrape(m) == first  # a second scrape adds nothing twice
    m.request("m", "ok", 0.01, None, 1, 1)
    assert 'llmgw_requests_total{model="m",status="ok"} 2.0' in _scrape(m)


def test_with_several_workers_each_request_is_written_at_once(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    m = _metrics()
    assert m._tallies is None


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


def _record(i: int, request_id: str | None = None) -> UsageRecord:
    return UsageRecord(request_id=request_id or f"r{i}", model="m", upstream_model="m", replica="r1",
                       status="ok", http_status=200, stream=False, prompt_tokens=1, completion_tokens=1,
                       usage_estimated=False, ttft_ms=None, duration_ms=1.0, finish_reason="stop",
                       retries=0, started_at=1.0, key_id="key_1")


def test_usage_shipping_is_on_the_gateways_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records the gateway gives up on were only in its log: an operator could not alert on
    lost usage. Each way of losing them is counted, and what waits is a gauge."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(usage, "CLOSE_DEADLINE", 0.3)
    dropped = "llmgw_usage_records_dropped_total"

    async def main() -> None:
        mode = {"up": False}

        async def ship(body: bytes) -> None:
            if not mode["up"]:
                raise ConnectionRefusedError("down")
            if b'"bad"' in body:
                raise usage.BatchRejected("HTTP 400")

        m = _metrics()
        sink = usage.UsageSink(None, ship=ship, gateway_id="gw_1", max_pending=3)
        sink.watch = m
        for i in range(5):  # two past the bound
            sink.record(_record(i))
        assert not await sink.send()
        assert not await sink.send()
        got = _samples(m)
        assert got[(dropped, (("reason", "backlog"),))] == 2
        assert got[("llmgw_usage_post_failures_total", ())] == 2
        assert got[("llmgw_usage_pending_records", ())] == 3
        assert got[("llmgw_usage_pending_records_max", ())] == 3
        mode["up"] = True
        assert await sink.send()
        assert _samples(m)[("llmgw_usage_pending_records", ())] == 0
        sink.record(_record(0, "bad"))
        assert await sink.send()
        assert _samples(m)[(dropped, (("reason", "refused"),))] == 1
        mode["up"] = False
        sink.record(_record(6))
        sink.record(_record(7))
        await sink.close()  # the control plane stays down past the deadline
        got = _samples(m)
        assert got[(dropped, (("reason", "shutdown"),))] == 2
        assert got[(dropped, (("reason", "backlog"),))] == 2  # nothing counted twice

    asyncio.run(asyncio.wait_for(main(), 30))


def test_gauges_of_workers_that_died_leave_the_sums(tmp_path: Path) -> None:
    """With several workers a gauge is the sum over the workers' files; a worker that crashed
    and was started again left its file, which counted forever."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = int(dead.stdout)
    mine = os.getpid()
    for name in (f"gauge_livesum_{gone}.db", f"gauge_livesum_{mine}.db", f"counter_{gone}.db"):
        (tmp_path / name).write_bytes(b"")
    forget_dead_workers(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{gone}.db", f"gauge_livesum_{mine}.db"]
    forget_dead_workers(str(tmp_path / "absent"))  # not made yet: nothing to forget
