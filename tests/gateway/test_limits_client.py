"""The gateway's limiter in one process against the real authority: coalescing, release, fail mode."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.control.limits import LimitsAuthority
from llmgw.gateway.limits import FREE, Denied, Limiter, Unavailable
from llmgw.protocol.wire import KeyEntry, LeaseAsk, LeaseReply, LeaseRequest, Limits
from tests.support.procs import wait_for_async


def _entry(limits: Limits) -> KeyEntry:
    return KeyEntry(key_id="key_1", hash="h", org_id="o", team_id="t", project_id="p", limits=limits)


class Counting:
    def __init__(self, auth: LimitsAuthority) -> None:
        self.auth = auth
        self.calls: list[LeaseRequest] = []

    async def __call__(self, req: LeaseRequest) -> LeaseReply:
        self.calls.append(req)
        await asyncio.sleep(0)  # an answer comes later than the call, as over HTTP
        return await self.auth.lease(req)


async def _run(limiter: Limiter, coro: object) -> object:
    task = asyncio.ensure_future(limiter.run())
    try:
        return await coro  # type: ignore[misc]
    finally:
        task.cancel()


def test_unlimited_keys_never_call_the_authority() -> None:
    limiter = Limiter("gw", Counting(LimitsAuthority()))
    assert limiter.take(_entry(Limits()), None) is FREE


def test_waiting_requests_share_one_lease_call_and_give_everything_back() -> None:
    async def main() -> None:
        lease = Counting(LimitsAuthority())
        limiter = Limiter("gw", lease, idle_return=0.05, interval=0.01)
        entry = _entry(Limits(rpm=6000, concurrency=40))

        async def go() -> None:
            t = limiter.take(entry, None) or await limiter.acquire(entry, None)
            t.release(5)

        async def all_of_them() -> None:
            await asyncio.gather(*(go() for _ in range(40)))

        await _run(limiter, all_of_them())
        # 40 requests at once: one call asked for all 40 slots.
        asks = [a for c in lease.calls for a in c.asks if a.slots]
        assert len(asks) == 1 and asks[0].slots == 40
        assert limiter.in_flight() == 0
        # Idle: the slots go back to the authority.
        task = asyncio.ensure_future(limiter.run())
        while lease.auth.in_flight("key:key_1"):
            await asyncio.sleep(0.01)
        task.cancel()
        assert limiter.keys["key_1"].slots_held == 0

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_refusal_names_the_limit_and_is_answered_locally_meanwhile() -> None:
    async def main() -> None:
        lease = Counting(LimitsAuthority())
        limiter = Limiter("gw", lease, interval=0.01)
        entry = _entry(Limits(rpm=2))

        async def three() -> None:
            for _ in range(2):
                assert (limiter.take(entry, None) or await limiter.acquire(entry, None)) is not None
            with pytest.raises(Denied) as e:
                limiter.take(entry, None) or await limiter.acquire(entry, None)
            assert e.value.limit == "rpm" and 59 <= e.value.retry_after <= 60
            n = len(lease.calls)
            with pytest.raises(Denied):
                limiter.take(entry, None)
            assert len(lease.calls) == n  # the cached refusal did not call again

        await _run(limiter, three())

    asyncio.run(asyncio.wait_for(main(), 10))


def test_an_unreachable_authority_makes_requests_unavailable_within_the_wait() -> None:
    async def down(req: LeaseRequest) -> LeaseReply:
        raise ConnectionRefusedError("connection refused")

    async def main() -> None:
        limiter = Limiter("gw", down, wait=0.2, interval=0.01)
        entry = _entry(Limits(concurrency=1))

        async def one() -> None:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(Unavailable):
                await limiter.acquire(entry, None)
            assert loop.time() - t0 < 0.3

        await _run(limiter, one())

    asyncio.run(asyncio.wait_for(main(), 10))


def test_token_estimates_settle_to_what_requests_used() -> None:
    async def main() -> None:
        auth = LimitsAuthority()
        limiter = Limiter("gw", Counting(auth), idle_return=0.05, interval=0.01)
        entry = _entry(Limits(tpm=10_000))

        async def some() -> None:
            for _ in range(5):
                t = limiter.take(entry, None, 300) or await limiter.acquire(entry, None, 300)
                t.release(40)  # estimated 300, used 40

        await _run(limiter, some())
        task = asyncio.ensure_future(limiter.run())
        while auth.window_tokens("key:key_1") != 200:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_busy_share_is_renewed_ahead_so_requests_do_not_wait() -> None:
    async def main() -> tuple[int, int]:
        auth = LimitsAuthority(ttl=0.3)  # leases expire often: each expiry would be a wait
        limiter = Limiter("gw", Counting(auth), interval=0.05)
        entry = _entry(Limits(rpm=10**9, tpm=10**12))
        waited = 0

        async def steady() -> None:
            nonlocal waited
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.5
            while loop.time() < end:
                t = limiter.take(entry, None, 50)
                if t is None:
                    waited += 1
                    t = await limiter.acquire(entry, None, 50)
                t.release(40)
                await asyncio.sleep(0.005)

        await _run(limiter, steady())
        return waited, int(auth.window_units("key:key_1"))

    waited, units = asyncio.run(asyncio.wait_for(main(), 10))
    # The first request waits for the first lease; after that the units and tokens (ttl
    # 0.3 s) are renewed before they run out. Without renewal: a wait at each expiry of
    # each (10 here); a margin of 2 for a loop tick delayed on a busy machine.
    assert 1 <= waited <= 3
    assert units > 0


def test_only_the_periodic_passes_tick_for_the_usage_sink() -> None:
    """A pass called early for a waiting request carries no post: the posts keep their pace."""

    async def main() -> tuple[int, int]:
        ticks: list[float] = []
        calm = Limiter("gw", Counting(LimitsAuthority()), interval=0.02)
        calm.on_tick = lambda: ticks.append(0.0)
        await _run(calm, asyncio.sleep(0.2))
        periodic = len(ticks)
        ticks.clear()
        waited = Limiter("gw", Counting(LimitsAuthority()), interval=60.0)
        waited.on_tick = lambda: ticks.append(0.0)
        entry = _entry(Limits(rpm=600))

        async def one() -> None:
            t = waited.take(entry, None) or await waited.acquire(entry, None)
            t.release(1)

        await _run(waited, one())
        return periodic, len(ticks)

    periodic, early = asyncio.run(asyncio.wait_for(main(), 10))
    assert periodic >= 3  # 0.2 s of passes every 0.02 s, on a machine that may be slow
    assert early == 0


def test_a_forgotten_share_is_made_again_and_a_new_snapshot_entry_brings_its_limits() -> None:
    """The limiter remembers each key's shares per snapshot entry; neither a share dropped
    for idleness nor a changed limit may leave a request with a stale one."""
    import llmgw.gateway.limits as limits_mod

    async def main() -> None:
        limiter = Limiter("gw", Counting(LimitsAuthority()), idle_return=0.0, interval=0.01)
        task = asyncio.ensure_future(limiter.run())
        old = limits_mod.FORGET_AFTER
        try:
            entry = _entry(Limits(rpm=6000))
            t = limiter.take(entry, None) or await limiter.acquire(entry, None)
            t.release(1)
            first = limiter.keys["key_1"]
            # Idle past FORGET_AFTER: the share's units go back and the share is dropped.
            limits_mod.FORGET_AFTER = 0.0
            while "key_1" in limiter.keys:
                await asyncio.sleep(0.01)
            limits_mod.FORGET_AFTER = old
            t = limiter.take(entry, None) or await limiter.acquire(entry, None)
            t.release(1)
            assert limiter.keys["key_1"] is not first
            # A new snapshot's entry for the key, with another limit: the share takes it.
            stricter = _entry(Limits(rpm=1))
            t = limiter.take(stricter, None) or await limiter.acquire(stricter, None)
            assert limiter.keys["key_1"].limits == Limits(rpm=1)
        finally:
            limits_mod.FORGET_AFTER = old
            task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_share_that_spends_tokens_fast_asks_for_more_at_a_time() -> None:
    """A hot key spends a token lease before the next periodic call can renew it: every
    request in flight would then wait for a lease call, several times a second. The
    token batch grows while leases run out within a second of coming (as units do)."""

    async def main() -> tuple[list[float], int]:
        auth = LimitsAuthority()
        lease = Counting(auth)
        limiter = Limiter("gw", lease, interval=0.25)
        entry = _entry(Limits(tpm=10**12))
        waits: list[float] = []

        async def hot() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            while loop.time() < start + 2.0:
                # About a million tokens a second: the first 100k-token lease lasts 0.1 s.
                t = limiter.take(entry, None, 2000)
                if t is None:
                    waits.append(loop.time() - start)
                    t = await limiter.acquire(entry, None, 2000)
                t.release(2000)
                await asyncio.sleep(0.002)

        await _run(limiter, hot())
        return waits, max(a.tokens for c in lease.calls for a in c.asks)

    waits, largest = asyncio.run(asyncio.wait_for(main(), 10))
    # With a fixed 100k batch: a wait at every lease, 19 in 2 s (measured, every 0.1 s),
    # about 10 in the second second. Growing, the waits are the first lease's and a few while
    # the batch doubles (4 measured), none once leases outlast the 0.25 s between calls.
    assert len(waits) <= 6, waits
    assert len([w for w in waits if w > 1.0]) <= 1, waits
    assert largest > 100_000


def test_a_share_that_spends_units_fast_asks_for_more_than_4096() -> None:
    """The same for request units: a key at ~10,000 req/s spent a 4,096-unit grant in 0.4 s;
    with a second between periodic calls, every grant ended in a wait."""

    async def main() -> tuple[list[float], int]:
        auth = LimitsAuthority(ttl=5.0)
        lease = Counting(auth)
        limiter = Limiter("gw", lease, interval=1.0)
        entry = _entry(Limits(rpm=10**9))
        waits: list[float] = []

        async def hot() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            while loop.time() < start + 3.0:
                for _ in range(20):  # about 10,000 requests a second
                    t = limiter.take(entry, None)
                    if t is None:
                        waits.append(loop.time() - start)
                        t = await limiter.acquire(entry, None)
                    t.release(1)
                await asyncio.sleep(0.002)

        await _run(limiter, hot())
        return waits, max(a.units for c in lease.calls for a in c.asks)

    waits, largest = asyncio.run(asyncio.wait_for(main(), 15))
    # Waits while the batch doubles from 32; then grants outlast what a second takes, and the
    # last second waits at most once (a bound of 4,096 waited every 0.4 s: two or three times).
    # One, not none: renewing ahead assumes the next second's pace is under twice the last
    # one's, and on a loaded CI machine this loop's own pace can double when a stall ends
    # (a wait at 2.998 s once failed CI).
    assert len([w for w in waits if w > 2.0]) <= 1, waits
    assert largest > 4096


def test_a_share_that_pauses_asks_for_the_batch_it_grew_to_when_it_comes_back() -> None:
    """A key that pauses gives back what it holds; coming back at its rate, it waits for one
    lease call, not for its batch to double again from 32 (a wait at each doubling, every
    request in flight stalled for the call's round trip)."""

    async def main() -> tuple[int, int]:
        limiter = Limiter("gw", Counting(LimitsAuthority()), idle_return=0.05, interval=0.02)
        entry = _entry(Limits(rpm=10**9, tpm=10**12))

        async def burst(n: int) -> int:
            waits = 0
            for _ in range(n):
                t = limiter.take(entry, None, 50)
                if t is None:
                    waits += 1
                    t = await limiter.acquire(entry, None, 50)
                t.release(50)
            return waits

        async def both() -> tuple[int, int]:
            first = await burst(4000)
            await wait_for_async("the paused key's units given back",  # quiet meanwhile
                                 lambda: limiter.keys["key_1"].units == 0)
            return first, await burst(4000)

        return await _run(limiter, both())  # type: ignore[return-value]

    first, again = asyncio.run(asyncio.wait_for(main(), 10))
    assert first >= 4  # 32, 64, ... up to 4,096 units: a wait at each
    assert again == 1


def test_a_share_renews_ahead_at_the_pace_it_is_used() -> None:
    """A rest that is more than a quarter of the batch but less than twice what the last
    interval took is renewed now: it would run out before the next pass."""
    from llmgw.gateway.limits import Share

    limiter = Limiter("gw", Counting(LimitsAuthority()))
    s = Share("key:k", Limits(rpm=10**9))
    s.units, s.unit_batch, s.units_until, s.last_used = 1000, 1600, 1e9, 0.0
    s.units_mark = 1000
    limiter._renew(s, 0.0, False)
    assert s.want_units == 0  # nothing taken since the last pass
    s.units = 600  # 400 taken in one interval: 600 left lasts 1.5 intervals
    limiter._renew(s, 0.0, False)
    assert s.want_units == 1


def test_a_worker_cut_off_past_reclaim_after_gives_its_slots_up() -> None:
    """A worker whose lease calls go unanswered for nearly `reclaim_after` gives its slots up
    before the authority grants them to another gateway: a slot freed meanwhile is not used
    again, a request still running is a debt the next grant covers, and once it is back the
    limit holds over both gateways. Before, it kept its slots and reported them when back: a
    concurrency of 3 had 4 slots held."""
    now = [1000.0]
    auth = LimitsAuthority(clock=lambda: now[0])
    down = [False]
    seen: list[LeaseRequest] = []

    async def lease(req: LeaseRequest) -> LeaseReply:
        if down[0]:
            raise ConnectionRefusedError("connection refused")
        seen.append(req)
        return await auth.lease(req)

    limiter = Limiter("gw", lease, clock=lambda: now[0], interval=0.01, wait=0.2)
    entry = _entry(Limits(concurrency=3))

    async def main() -> None:
        a = await limiter.acquire(entry, None)
        b = limiter.take(entry, None) or await limiter.acquire(entry, None)
        a.release(0)  # one slot free, one in use
        down[0] = True
        now[0] += auth.reclaim_after - 2 * limiter.interval  # as far as it knows, its slots are gone
        await asyncio.sleep(0.05)  # a few passes of the loop
        share = limiter.keys["key_1"]
        assert share.slots_held == 0 and share.slots_free == -1  # b's slot is a debt
        assert limiter.take(entry, None) is None  # the slot a freed is not used again
        assert limiter.in_flight() == 1
        # The authority takes them back, and grants the whole limit to another gateway.
        now[0] += 1.0
        other = auth.lease_now(LeaseRequest(gateway_id="gw2", asks=[LeaseAsk(
            scope="key:key_1", limits=entry.limits, slots=3)]), now[0])
        assert other.grants[0].slots == 3
        down[0] = False
        with pytest.raises(Denied):  # back: b still runs, and no slot is left for it
            await limiter.acquire(entry, None)
        ask = seen[-1].asks[0]
        assert ask.slots_held == 0 and ask.slots == 2  # one for the request, one for b's debt
        assert auth.in_flight("key:key_1") == 3
        b.release(0)
        assert share.slots_free == 0

    asyncio.run(asyncio.wait_for(_run(limiter, main()), 10))
