"""After a failover (or a restart) the fleet places nothing until the nodes the store knows have
registered again, or two heartbeat intervals passed: their running replicas are adopted first."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from llmgw.control.fleet import Fleet
from llmgw.control.settings import Settings
from llmgw.store import connect, migrate
from tests.control.test_fleet_loop import MODEL, FakeLink, reg


def test_a_new_leader_waits_for_known_nodes_before_placing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db"
    two = msgspec.structs.replace(MODEL, min_replicas=2)

    async def run() -> None:
        db = await connect(url)
        await migrate(db)
        before = Fleet(db, Settings(), [], b"s" * 32)  # the old leader: knew n1 and n2
        await before.load()
        await before.register(reg("n1"), FakeLink("n1"))
        await before.register(reg("n2"), FakeLink("n2"))

        fleet = Fleet(db, Settings(heartbeat_interval=5), [two], b"s" * 32)
        await fleet.load()
        assert fleet.awaiting == {"n1", "n2"}
        n1 = FakeLink("n1")
        await fleet.register(reg("n1"), n1)
        await fleet.reconcile()
        assert n1.sent == [] and fleet.settling(time.time())  # n2 not back yet: nothing placed
        n2 = FakeLink("n2")
        await fleet.register(reg("n2"), n2)
        assert not fleet.settling(time.time())
        await fleet.reconcile()
        assert sorted(r.node for r in fleet.replicas.values()) == ["n1", "n2"]  # spread
        await db.close()

    asyncio.run(run())


def test_the_grace_ends_after_two_heartbeats_without_the_missing_node(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db"

    async def run() -> None:
        db = await connect(url)
        await migrate(db)
        before = Fleet(db, Settings(), [], b"s" * 32)
        await before.load()
        await before.register(reg("n1"), FakeLink("n1"))
        await before.register(reg("n2"), FakeLink("n2"))

        fleet = Fleet(db, Settings(heartbeat_interval=5), [MODEL], b"s" * 32)
        now = time.time()
        await fleet.load(now)
        n1 = FakeLink("n1")
        await fleet.register(reg("n1"), n1)
        assert fleet.settling(now + 9.9) and not fleet.settling(now + 10.1)
        await fleet.reconcile(now + 10.1)
        assert [s[:2] for s in n1.sent] == [("start", "m-1")]
        await db.close()

    asyncio.run(run())
