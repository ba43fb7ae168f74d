"""The fleet loop in process, against a SQLite store and agents faked at the link: what it
starts, adopts, stops and publishes, and what a new control plane keeps from the store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from llmgw.admin.fleet import model_view
from llmgw.control.catalog import Model, Profile, Source
from llmgw.control.fleet import Fleet
from llmgw.control.inventory import Gpu, Replica
from llmgw.control.reports import NodeFacts, Registration, Status
from llmgw.control.settings import Settings
from llmgw.protocol.wire import Snapshot
from llmgw.store import connect, migrate

GiB = 2**30
MODEL = Model(name="m", source=Source(repo="o/m"), min_replicas=1, profiles=[
    Profile(name="sim", engine="sim", gpu_class="H100-80GB", gpu_memory=70 * GiB)])


class FakeLink:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.sent: list[tuple[Any, ...]] = []

    def start(self, replica: Replica, model: Model, profile: Profile, key: str) -> None:
        self.sent.append(("start", replica.id, tuple(replica.gpus), key))

    def stop(self, replica_id: str, drain_s: float) -> None:
        self.sent.append(("stop", replica_id, drain_s))

    def request_logs(self, replica_id: str, lines: int) -> None:
        self.sent.append(("logs", replica_id, lines))

    def close(self) -> None:
        self.sent.append(("close",))


def reg(node: str, *running: Status) -> Registration:
    gpus = [Gpu(uuid=f"{node}-g{i}", index=i, model="H100", gpu_class="H100-80GB",
                memory_total=80 * GiB, memory_free=80 * GiB, simulated=True) for i in range(2)]
    return Registration(node_id=node, hostname=node, labels={}, replicas=running,
                        facts=NodeFacts(gpus=gpus, cpu_cores=8, memory_bytes=64 * GiB,
                                        engines=["sim"], address="127.0.0.1"))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_place_start_publish_and_adopt_after_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db"

    async def first() -> None:
        db = await connect(url)
        await migrate(db)
        pokes: list[int] = []
        fleet = Fleet(db, Settings(), [MODEL], b"s" * 32, poke=lambda: pokes.append(1))
        await fleet.load()
        link = FakeLink("n1")
        await fleet.register(reg("n1"), link)
        await fleet.reconcile()
        assert link.sent == [("start", "m-1", ("n1-g0",), fleet.engine_key)]
        assert fleet.replicas["m-1"].state == "pending" and fleet.published == ()
        ready = Status(replica_id="m-1", model="m", state="ready", port=20001, pid=7)
        await fleet.report("n1", link, [ready], heartbeat=False)
        await fleet.reconcile()
        assert fleet.published == ("m-1",) and pokes
        snap = fleet.fill(Snapshot(version=1))
        assert [(r.id, r.url, r.engine_key) for r in snap.replicas] == [
            ("m-1", "http://127.0.0.1:20001", fleet.engine_key)]
        # A stale status from another stream is ignored; a replica the node should not
        # run is stopped.
        await fleet.report("n1", FakeLink("n1"), [ready], heartbeat=True)
        stray = Status(replica_id="x-9", model="x", state="ready", port=20002)
        await fleet.report("n1", link, [ready, stray], heartbeat=True)
        assert link.sent[-1] == ("stop", "x-9", 0.0)
        await db.close()

    async def second() -> None:
        # A new control plane: the replica is adopted from the store, not placed again,
        # and the node gets its full lost_after to come back.
        db = await connect(url)
        fleet = Fleet(db, Settings(), [MODEL], b"s" * 32)
        await fleet.load()
        assert fleet.published == ("m-1",)
        actions = await fleet.reconcile()
        assert [type(a).__name__ for a in actions] == ["Publish"]
        link = FakeLink("n1")
        await fleet.register(reg("n1", Status(replica_id="m-1", model="m", state="ready",
                                              port=20001)), link)
        await fleet.reconcile()
        assert link.sent == [] and fleet.replicas["m-1"].state == "ready"
        await db.close()

    run(first())
    run(second())


def test_a_start_lost_with_the_stream_is_sent_again(tmp_path: Path) -> None:
    async def body() -> None:
        db = await connect(f"sqlite:///{tmp_path}/db")
        await migrate(db)
        fleet = Fleet(db, Settings(), [MODEL], b"s" * 32)
        await fleet.load()
        link = FakeLink("n1")
        await fleet.register(reg("n1"), link)
        await fleet.reconcile()
        link2 = FakeLink("n1")  # reconnected; the agent never got the start
        await fleet.register(reg("n1"), link2)
        assert link.sent[-1] == ("close",)
        assert link2.sent == [("start", "m-1", ("n1-g0",), fleet.engine_key)]
        await db.close()

    run(body())


def test_wake_scales_a_model_from_zero(tmp_path: Path) -> None:
    async def body() -> None:
        db = await connect(f"sqlite:///{tmp_path}/db")
        await migrate(db)
        zero = Model(name="z", source=Source(repo="o/z"), min_replicas=0, max_replicas=2,
                     profiles=MODEL.profiles)
        fleet = Fleet(db, Settings(), [zero], b"s" * 32)
        await fleet.load()
        link = FakeLink("n1")
        await fleet.register(reg("n1"), link)
        await fleet.reconcile()
        assert link.sent == []
        assert model_view(fleet, zero).wanted == 0
        assert fleet.wake_model("z") == 1
        assert model_view(fleet, zero).wanted == 1  # ctl models shows what the wake asked for
        await fleet.reconcile()
        assert [s[:2] for s in link.sent] == [("start", "z-1")]
        await db.close()

    run(body())
