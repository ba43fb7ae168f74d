"""The gateway's metrics (gateway/metrics.py): tallied requests scrape exactly as observed ones."""

from __future__ import annotations

import pytest

from llmgw.gateway.metrics import Metrics

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


def test_with_several_workers_each_request_is_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent-not-read-here")
    m = _metrics()
    assert m._tallies is None
