"""The retry budget (gateway/retry_budget.py): retries across requests, with a fake clock."""

from __future__ import annotations

import math

import pytest

from llmgw.gateway.retry_budget import WINDOW, RetryBank


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _allowed(b: RetryBank, most: int = 10_000) -> int:
    n = 0
    while n < most and b.allow():
        n += 1
    return n


def test_a_fresh_worker_may_retry_a_second_of_the_floor_and_then_not() -> None:
    b = RetryBank(0.2, 10.0, Clock())
    assert _allowed(b) == 10
    assert not b.allow()


def test_retries_add_at_most_the_ratio_of_the_requests_sent() -> None:
    b = RetryBank(0.2, 0.0, Clock())
    assert not b.allow()  # nothing sent, no floor
    b.sent += 100
    assert _allowed(b) == 20
    b.sent += 5
    assert _allowed(b) == 1


def test_what_is_banked_fades_so_an_outage_gets_no_saved_up_burst() -> None:
    clock = Clock()
    b = RetryBank(0.2, 0.0, clock)
    clock.now += 5 * WINDOW
    b.sent += 1_000_000  # 20,000 requests a second for 50 s, and no retry needed
    # About WINDOW seconds of the ratio at that rate (0.2 x 20,000 x 10), not 0.2 x 1,000,000.
    assert _allowed(b, 10**6) == math.floor(200_000 / 5 * (1 - math.exp(-5)))
    clock.now += 10 * WINDOW
    b.sent += 100  # one request a second since
    assert _allowed(b) == math.floor(20 / 10 * (1 - math.exp(-10)))  # a window of it: 1.9998
    b.sent += 100  # a burst just now counts whole
    assert _allowed(b) == 20


def test_the_floor_fills_the_bank_to_a_window_of_it_however_long_the_idle() -> None:
    clock = Clock()
    b = RetryBank(0.2, 10.0, clock)
    assert _allowed(b) == 10
    clock.now += 0.5
    assert _allowed(b) == math.floor(10 * WINDOW * (1 - math.exp(-0.5 / WINDOW)))  # ~4.9: 4
    clock.now += 3600.0
    assert _allowed(b) == pytest.approx(10 * WINDOW, abs=1)


def test_no_ratio_and_no_floor_is_no_retry() -> None:
    clock = Clock()
    b = RetryBank(0.0, 0.0, clock)
    b.sent += 1000
    clock.now += 60
    assert not b.allow()
