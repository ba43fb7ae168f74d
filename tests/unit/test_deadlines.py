"""Deadlines on one loop timer (llmgw/net/deadlines.py): a fake loop for the wheel's arithmetic, a
real one for the task cancellation it stands in for `asyncio.timeout` with."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from llmgw.net.deadlines import Deadlines


class _Handle:
    def __init__(self, loop: FakeLoop, when: float, cb: Any) -> None:
        self.loop, self.when, self.cb, self.cancelled = loop, when, cb, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """time() and call_at() only: the test moves the clock and runs what came due."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[_Handle] = []
        self.errors: list[dict[str, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, cb: Any) -> _Handle:
        h = _Handle(self, when, cb)
        self.timers.append(h)
        return h

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def live(self) -> list[_Handle]:
        return [h for h in self.timers if not h.cancelled]

    def advance(self, to: float) -> None:
        """Moves the clock to `to`, running each live timer due by then, earliest first."""
        while True:
            due = sorted((h for h in self.live() if h.when <= to), key=lambda h: h.when)
            if not due:
                break
            h = due[0]
            h.cancelled = True  # a handle runs once
            self.now = max(self.now, h.when)
            h.cb()
        self.now = to


def _wheel(tick: float = 0.01) -> tuple[FakeLoop, Deadlines]:
    loop = FakeLoop()
    return loop, Deadlines(loop, tick)  # type: ignore[arg-type]


def test_a_deadline_fires_after_its_time_within_a_tick_and_never_before() -> None:
    loop, d = _wheel()
    fired: list[tuple[str, float]] = []
    d.add(100.0234, "a", lambda k: fired.append((k, loop.now)))
    loop.advance(100.0233)
    assert fired == []
    loop.advance(100.2)
    assert [k for k, _ in fired] == ["a"]
    assert 100.0234 <= fired[0][1] <= 100.0234 + 0.01


def test_thousands_of_deadlines_share_one_timer_and_fire_in_order() -> None:
    # What the wheel is for: a request's deadline costs a dict entry, not a loop timer.
    loop, d = _wheel()
    fired: list[int] = []
    for i in range(3000):
        d.add(100.0 + 0.5 + (i % 300) * 0.001, i, fired.append)
    assert len(loop.live()) == 1
    # An earlier deadline moves the one timer forward instead of adding a second.
    d.add(100.2, "early", lambda k: fired.append(-1))
    assert len(loop.live()) == 1 and 100.2 <= loop.live()[0].when <= 100.21 + 1e-9
    loop.advance(101.0)
    assert len(fired) == 3001 and fired[0] == -1
    # Slot by slot: no deadline ran before one due more than a tick earlier.
    when = [0.5 + (i % 300) * 0.001 for i in fired[1:]]
    assert all(b >= a - 0.01 for a, b in itertools.pairwise(when))
    assert loop.live() == []  # nothing waits: no timer


def test_a_removed_deadline_never_fires_and_removing_one_that_fired_is_harmless() -> None:
    loop, d = _wheel()
    fired: list[str] = []
    keep = d.add(100.05, "keep", fired.append)
    gone = d.add(100.05, "gone", fired.append)
    d.remove(gone, "gone")
    loop.advance(100.1)
    assert fired == ["keep"]
    d.remove(keep, "keep")  # after it fired: nothing
    d.remove(12345, "never")  # a slot that never existed: nothing
    assert fired == ["keep"]


def test_a_deadline_added_by_a_callback_for_a_time_already_past_runs_in_the_same_pass() -> None:
    loop, d = _wheel()
    fired: list[str] = []

    def again(k: str) -> None:
        fired.append(k)
        if k == "first":
            d.add(loop.now - 1.0, "second", again)

    d.add(100.05, "first", again)
    loop.advance(100.06)
    assert fired == ["first", "second"]


def test_a_callback_that_raises_is_reported_and_the_others_still_fire() -> None:
    loop, d = _wheel()
    fired: list[str] = []

    def boom(k: str) -> None:
        raise RuntimeError("broken callback")

    d.add(100.05, "bad", boom)
    d.add(100.05, "good", fired.append)
    loop.advance(100.1)
    assert fired == ["good"]
    assert [type(e["exception"]) for e in loop.errors] == [RuntimeError]


def test_a_tick_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 0"):
        Deadlines(FakeLoop(), 0)  # type: ignore[arg-type]


def test_cancel_at_cancels_the_task_and_expired_says_it_was_the_deadline() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        d = Deadlines(loop)
        t0 = loop.time()

        async def waits() -> str:
            task = asyncio.current_task()
            assert task is not None
            slot = d.cancel_at(loop.time() + 0.05, task)
            try:
                await loop.create_future()  # never done
            except asyncio.CancelledError:
                if not d.expired(task):
                    raise
                # Withdrawn: the task goes on and can wait again.
                await asyncio.sleep(0)
                return "timed out"
            finally:
                d.remove(slot, task)
            return "finished"

        got = await asyncio.create_task(waits())
        return got, loop.time() - t0

    got, took = asyncio.run(main())
    assert got == "timed out"
    assert 0.05 <= took < 1.0


@pytest.mark.parametrize("deadline_too", [False, True], ids=["elsewhere", "both"])
def test_a_cancellation_from_elsewhere_is_never_taken_for_the_deadline(deadline_too: bool) -> None:
    async def main() -> bool:
        loop = asyncio.get_running_loop()
        d = Deadlines(loop)
        saw: list[bool] = []

        async def waits() -> None:
            task = asyncio.current_task()
            assert task is not None
            now = loop.time()
            # Far off; or due at once, with another cancellation in the same pass before
            # the task runs again.
            slot = d.cancel_at(now if deadline_too else now + 10.0, task)
            if deadline_too:
                d.add(now, "elsewhere", lambda _: task.cancel())
            try:
                await loop.create_future()
            except asyncio.CancelledError:
                saw.append(d.expired(task))
                raise
            finally:
                d.remove(slot, task)

        t = asyncio.create_task(waits())
        if not deadline_too:
            await asyncio.sleep(0.01)
            t.cancel()  # the client left, the worker stops: not the deadline
        with pytest.raises(asyncio.CancelledError):
            await t
        assert len(d) == 0
        return saw[0]

    assert asyncio.run(main()) is False
