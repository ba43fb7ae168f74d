"""How many retries one worker may add to what its clients send (a retry budget).

`retries` bounds the tries of one request; this bounds them across requests. When every
replica fails at once (a bad rollout, an overloaded pool answering 429 or 5xx), a retry
per request would double the load on replicas that are already failing. With a budget,
retries add at most `ratio` of the requests recently sent, plus `min_per_second` whatever
the rate, so a quiet gateway still retries its few failures. Linkerd and Envoy bound
retries the same way.

The budget is a bank of retries: each request sent deposits `ratio`, each second
`min_per_second`, and each retry withdraws one. What is banked fades with a time constant
of `WINDOW` seconds, so a long healthy stretch does not save up a burst of retries for
the next outage: the bank holds about `WINDOW` seconds' worth of deposits at the recent
rate. Per worker, on the worker's loop: no lock, and nothing on a request's path but one
counter (`sent`); the deposits are worked out when a retry is asked for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

WINDOW = 10.0
"""Seconds over which deposits fade (their time constant)."""


class RetryBank:
    """A worker's retry budget as it runs (`config.RetryBudget` is its setting): `sent`
    counts requests, `allow` decides a retry."""

    __slots__ = ("_at", "_clock", "_counted", "_tokens", "min_per_second", "ratio", "sent")

    def __init__(self, ratio: float, min_per_second: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ratio = ratio
        self.min_per_second = min_per_second
        self.sent = 0
        """Requests sent so far (the proxy adds one per request, before its first try)."""
        self._clock = clock
        self._counted = 0
        self._at = clock()
        # A second of the floor to start with: a fresh worker's first failures may retry.
        self._tokens = min_per_second

    def allow(self) -> bool:
        """Whether one more retry fits; if so, it is withdrawn."""
        now = self._clock()
        elapsed = max(now - self._at, 0.0)
        self._at = now
        fresh = self.sent - self._counted
        self._counted = self.sent
        # What came in since the last call (the requests sent, the floor) is taken as spread
        # evenly over `elapsed` and faded as it came: `kept` of it is left now. However long
        # the gap, that tends to WINDOW seconds' worth at the gap's average rate.
        if elapsed > 0.0:
            fade = math.exp(-elapsed / WINDOW)
            kept = -math.expm1(-elapsed / WINDOW) * WINDOW / elapsed
        else:
            fade = kept = 1.0
        self._tokens = self._tokens * fade + (fresh * self.ratio + elapsed * self.min_per_second) * kept
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
