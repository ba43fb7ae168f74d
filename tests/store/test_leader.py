"""The leader lease on PostgreSQL: take, renew, no steal before expiry, steal after, one winner,
release; and a leader that cannot renew steps down by its own deadline (fencing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from llmgw.control.leader import Leadership
from llmgw.store import Database, StoreError, connect, migrate
from llmgw.store import fleet as fleet_rows
from llmgw.store import leader as lease
from tests.support.pg import drop_pg_database, fresh_pg_database


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database (the lease is PostgreSQL's only: SQLite has one control plane)."""
    url = fresh_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


async def _open(url: str) -> Database:
    db = await connect(url)
    await migrate(db)
    return db


def test_take_renew_no_steal_then_steal_after_expiry(pg_url: str) -> None:
    async def run() -> None:
        db = await _open(pg_url)
        try:
            assert await lease.current(db) is None
            a = await lease.take(db, "a", "http://a:1", "a:2", 30.0)
            assert a is not None and a.holder == "a" and a.live
            assert 29.0 < a.expires_at - a.now <= 30.0  # the database's clock, not ours
            # A live lease is not stolen, and the refusal changes nothing.
            assert await lease.take(db, "b", "http://b:1", "b:2", 30.0) is None
            cur = await lease.current(db)
            assert cur is not None and (cur.holder, cur.admin_url, cur.agent_address) == (
                "a", "http://a:1", "a:2")
            # Renewing keeps `since` and moves the expiry.
            again = await lease.take(db, "a", "http://a:1", "a:2", 60.0)
            assert again is not None and again.since == a.since
            assert again.expires_at > a.expires_at + 29.0
            # Expired (a renewal with a TTL already past): anyone may take it, with a new since.
            assert await lease.take(db, "a", "http://a:1", "a:2", -1.0) is not None
            expired = await lease.current(db)
            assert expired is not None and not expired.live
            b = await lease.take(db, "b", "http://b:1", "b:2", 30.0)
            assert b is not None and b.holder == "b" and b.since > a.since
            assert await lease.take(db, "a", "http://a:1", "a:2", 30.0) is None
            # A clean stop gives it up at once; only the holder can.
            assert not await lease.release(db, "a")
            assert await lease.release(db, "b")
            assert await lease.take(db, "a", "http://a:1", "a:2", 30.0) is not None
        finally:
            await db.close()

    asyncio.run(run())


def test_taking_back_ones_own_expired_lease_starts_a_new_term(pg_url: str) -> None:
    # A leader that lost its lease (it could not renew in time) and takes it again later
    # leads a new term: a new epoch, and `since` (what `ctl leader` shows) is the new start.
    async def run() -> None:
        db = await _open(pg_url)
        try:
            a = await lease.take(db, "a", "http://a:1", "a:2", 30.0)
            assert a is not None
            assert await lease.take(db, "a", "http://a:1", "a:2", -1.0) is not None  # lapses
            back = await lease.take(db, "a", "http://a:1", "a:2", 30.0)
            assert back is not None and back.epoch == a.epoch + 1 and back.since > a.since
            renewed = await lease.take(db, "a", "http://a:1", "a:2", 30.0)
            assert renewed is not None and (renewed.epoch, renewed.since) == (back.epoch, back.since)
        finally:
            await db.close()

    asyncio.run(run())


def test_racing_for_an_expired_lease_has_one_winner(pg_url: str) -> None:
    async def run() -> None:
        dbs = [await _open(pg_url) for _ in range(8)]
        try:
            assert await lease.take(dbs[0], "old", "http://o:1", "o:2", -1.0) is not None
            got = await asyncio.gather(*(lease.take(db, f"c{i}", f"http://c{i}:1", f"c{i}:2", 30.0)
                                         for i, db in enumerate(dbs)))
            winners = [g.holder for g in got if g is not None]
            assert len(winners) == 1
            cur = await lease.current(dbs[0])
            assert cur is not None and cur.holder == winners[0]
        finally:
            for db in dbs:
                await db.close()

    asyncio.run(run())


class _Stalled:
    """A store whose statements never answer (a partitioned PostgreSQL), for fencing."""

    dialect = "postgres"

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        await asyncio.Event().wait()


def test_a_leader_that_cannot_renew_steps_down_by_its_deadline(pg_url: str) -> None:
    events: list[tuple[str, float]] = []

    async def run() -> None:
        db = await _open(pg_url)
        try:
            async def elected() -> None:
                events.append(("elected", time.monotonic()))

            async def deposed() -> None:
                events.append(("deposed", time.monotonic()))

            ttl = 0.6
            one = Leadership(db, ttl, "http://one:1", "one:2", elected, deposed)
            two = Leadership(db, ttl, "http://two:1", "two:2", elected, deposed)
            await one.attempt()
            await two.attempt()
            assert one.is_leader and not two.is_leader
            other = two.other_leader()
            assert other is not None and other.holder == one.id
            assert other.agent_address == "one:2"
            taken = time.monotonic()
            one.db = _Stalled()  # type: ignore[assignment]
            task = asyncio.create_task(one.run())
            async with asyncio.timeout(5):
                while one.is_leader:
                    await asyncio.sleep(0.01)
            # Fencing: down no later than its lease (plus a scheduling margin), before
            # the standby can have taken it.
            assert time.monotonic() - taken < ttl + 0.3
            assert [e for e, _ in events] == ["elected", "deposed"]
            task.cancel()
            # The standby takes it once it has expired by the database's clock, not before.
            await two.attempt()
            if not two.is_leader:
                await asyncio.sleep(ttl)
                await two.attempt()
            assert two.is_leader
            cur = await lease.current(db)
            assert cur is not None and cur.holder == two.id
        finally:
            await db.close()

    asyncio.run(run())



async def _after(delay: float, aw: Awaitable[None]) -> None:
    await asyncio.sleep(delay)
    await aw


def test_a_deposed_leaders_writes_are_refused_by_the_epoch_and_step_it_down(pg_url: str) -> None:
    # A leader paused past its TTL (SIGSTOP) wakes with tasks that write before its lease
    # loop runs: the fence refuses those writes and the refusal steps it down at once.
    events: list[str] = []

    async def run() -> None:
        db = await _open(pg_url)
        try:
            async def elected() -> None:
                events.append("elected")

            async def deposed() -> None:
                events.append("deposed")

            ttl = 0.6
            one = Leadership(db, ttl, "http://one:1", "one:2", elected, deposed)
            two = Leadership(db, ttl, "http://two:1", "two:2", elected, deposed)
            await one.attempt()
            assert one.is_leader and one.leader is not None and one.leader.epoch == 1
            old = one.fence(db)
            await fleet_rows.set_scale(old, "m", 2)
            await one.attempt()  # a renewal is the same term
            assert one.leader is not None and one.leader.epoch == 1
            await fleet_rows.set_scale(old, "m", 3)

            # Paused: no renewal; the standby takes the expired lease, a new epoch.
            await asyncio.sleep(ttl + 0.1)
            await two.attempt()
            assert two.is_leader and two.leader is not None and two.leader.epoch == 2
            with pytest.raises(lease.Deposed, match="epoch 2, this leader's is 1"):
                await fleet_rows.set_scale(old, "m", 9)
            assert not one.is_leader
            with pytest.raises(lease.Deposed):  # a transaction is fenced too
                await fleet_rows.delete_node(old, "n1")

            async def scale_up(tx: Database) -> None:
                await tx.execute("UPDATE model_scale SET replicas = 9 WHERE model = 'm'")

            with pytest.raises(lease.Deposed):  # and one run in a piece (run_transaction)
                await old.run_transaction(scale_up)
            await one.attempt()  # waits for the step-down; cannot take the live lease
            assert not one.is_leader and events == ["elected", "elected", "deposed"]
            assert old.refused == 3 and await fleet_rows.scales(db) == {"m": 3}
            new = two.fence(db)
            await fleet_rows.set_scale(new, "m", 4)
            assert await fleet_rows.scales(db) == {"m": 4}

            # A write in flight holds the takeover back until it committed: the new leader
            # (which loads the fleet after taking the lease) sees it.
            await two.attempt()
            async with new.transaction() as tx:
                take = asyncio.create_task(_after(ttl + 0.05, one.attempt()))
                await tx.fetchval("SELECT pg_sleep($1)", ttl + 0.3)  # expires meanwhile
                assert not take.done() and not one.is_leader
                await tx.execute("UPDATE model_scale SET replicas = 5 WHERE model = 'm'")
            await take
            assert one.is_leader and one.leader is not None and one.leader.epoch == 3
            assert await fleet_rows.scales(db) == {"m": 5}

            # But a writer paused inside its transaction (idle, not running a statement)
            # holds it back no longer than the idle limit (a third of the TTL): PostgreSQL
            # ends that transaction, its write is lost, and the lease moves on.
            paused = one.fence(db)
            with pytest.raises(StoreError):  # the session is gone
                async with paused.transaction() as tx:
                    await tx.execute("UPDATE model_scale SET replicas = 6 WHERE model = 'm'")
                    await asyncio.sleep(ttl + 0.05)  # the lease expired; still idle
                    begun = time.monotonic()
                    await two.attempt()
                    assert two.is_leader and time.monotonic() - begun < ttl / 3 + 0.3
                    await tx.execute("UPDATE model_scale SET replicas = 7 WHERE model = 'm'")
            assert await fleet_rows.scales(db) == {"m": 5}
            # The same holder taking its own lease again after it expired is a new term too.
            assert two.leader is not None and two.leader.epoch == 4
            assert (await lease.take(db, two.id, "http://two:1", "two:2", -1.0)) is not None
            again = await lease.take(db, two.id, "http://two:1", "two:2", 30.0)
            assert again is not None and again.epoch == 5
        finally:
            await db.close()

    asyncio.run(run())
