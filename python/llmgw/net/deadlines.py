"""Deadlines on one loop timer: a wheel of ticks, for the waits a request arms and nearly always disarms.

Under uvloop a loop timer costs about 2 µs to arm and cancel (`call_at`, then `cancel`: a
libuv timer made, started, stopped and closed), and `asyncio.timeout` about 4 µs. A gateway
request armed three (its body's deadline, the disconnect watch, the wait for the replica's
first byte) and disarmed them a few milliseconds later: 10 µs of a worker's 60 µs a
request at 15,000 requests/s (measured on a 2-vCPU Intel host with the bench's throughput
scenario).

Here a deadline is a dict entry in the slot of its tick (`tick` seconds wide): arming and
disarming are a dict insert and delete. One loop timer, armed only while a slot is
waiting, fires at the earliest slot's end and runs what came due there. A deadline
therefore fires up to one tick late, never early.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Hashable
from typing import Any

TICK = 0.01
"""Seconds a slot spans: how late a deadline may fire, and how often the timer runs while
deadlines wait."""


class Deadlines:
    """Calls `fire(key)` once `loop.time()` reaches a deadline, unless it was removed first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = TICK) -> None:
        if tick <= 0:
            raise ValueError("a tick must be longer than 0 seconds")
        self.loop = loop
        self.tick = tick
        self._rate = 1.0 / tick
        self._slots: dict[int, dict[Any, Callable[[Any], object]]] = {}
        self._due: list[int] = []
        """Slot numbers that have a dict in `_slots`, as a heap: the earliest first."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot = 0
        self._cancelled: set[asyncio.Task[Any]] = set()
        """Tasks `cancel_at` cancelled, until `expired` is asked about them."""

    def __len__(self) -> int:
        """Deadlines waiting (an upper bound: removed ones are counted until their slot comes)."""
        return sum(len(s) for s in self._slots.values())

    def add(self, when: float, key: Hashable, fire: Callable[[Any], object]) -> int:
        """Calls `fire(key)` at `when` (loop time) or up to a tick later; returns the slot
        that `remove` needs. A key is armed once at a time in a slot."""
        slot = int(when * self._rate) + 1  # the next tick's end: never early, at most a tick late
        entries = self._slots.get(slot)
        if entries is None:
            entries = self._slots[slot] = {}
            heapq.heappush(self._due, slot)
            if self._timer is None or slot < self._timer_slot:
                self._arm(slot)
        entries[key] = fire
        return slot

    def remove(self, slot: int, key: Hashable) -> None:
        """Disarms `key`'s deadline in `slot`; nothing when it fired or was removed already."""
        entries = self._slots.get(slot)
        if entries is not None:
            entries.pop(key, None)

    def cancel_at(self, when: float, task: asyncio.Task[Any]) -> int:
        """Cancels `task` at `when`, unless removed first (`remove(slot, task)`); once its
        CancelledError arrives, `expired(task)` says whether this deadline was the cause."""
        return self.add(when, task, self._cancel)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """For a task that caught CancelledError: True when `cancel_at` cancelled it and
        nothing else asked for it too (the cancellation is then withdrawn, and the caller
        answers the timeout); False means the caller must let the CancelledError go on."""
        if task not in self._cancelled:
            return False
        self._cancelled.discard(task)
        return task.uncancel() == 0

    def _cancel(self, task: asyncio.Task[Any]) -> None:
        self._cancelled.add(task)
        task.cancel()

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = self.loop.call_at(slot / self._rate, self._run)

    def _run(self) -> None:
        self._timer = None
        now = self.loop.time()
        due, slots = self._due, self._slots
        while due and due[0] / self._rate <= now:
            # Popped before its entries fire: a `remove` from a fire finds nothing, and an
            # `add` to a slot already due makes a new one, run before this loop ends.
            for key, fire in slots.pop(heapq.heappop(due)).items():
                try:
                    fire(key)
                except Exception as e:  # noqa: BLE001 - one deadline's failure must not stop the others
                    self.loop.call_exception_handler({"message": "a deadline's callback failed", "exception": e})
        if due:
            self._arm(due[0])

    def close(self) -> None:
        """Drops every deadline and the timer (the loop is ending)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._slots.clear()
        self._due.clear()
        self._cancelled.clear()
