"""The gateway's bookkeeping of placed replicas, the catalog and wakes, without processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.admin.internal import wake as wake_route
from llmgw.admin.route import ApiError, Request
from llmgw.config import Endpoint, HealthChecks
from llmgw.gateway.fleet import Catalog, diff_replicas
from llmgw.gateway.replicas import ReplicaSet
from llmgw.gateway.wake import Waker, WakeRefused
from llmgw.net.client import Pool
from llmgw.protocol.wire import ModelEntry, ReplicaEntry, WakeReply, WakeRequest
from llmgw.store.errors import Invalid, NotFound, TenancyError


def rep(rid: str, model: str = "m", port: int = 9000, key: str | None = "k") -> ReplicaEntry:
    return ReplicaEntry(id=rid, model=model, url=f"http://127.0.0.1:{port}", engine_key=key)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


# -- diff_replicas ------------------------------------------------------------------------

def test_diff_adds_removes_and_replaces_what_changed() -> None:
    held = {"a": rep("a"), "b": rep("b"), "c": rep("c")}
    d = diff_replicas(held, [rep("a"), rep("b", port=9001), rep("d")], set())
    assert [e.id for e in d.added] == ["b", "d"]
    assert d.removed == ["b", "c"]
    assert d.clashes == []


def test_diff_of_the_same_replicas_is_empty() -> None:
    held = {"a": rep("a"), "b": rep("b")}
    d = diff_replicas(held, [rep("b"), rep("a")], set())
    assert (d.added, d.removed) == ([], [])


def test_a_new_engine_key_is_a_new_replica() -> None:
    d = diff_replicas({"a": rep("a", key="k1")}, [rep("a", key="k2")], set())
    assert ([e.engine_key for e in d.added], d.removed) == (["k2"], ["a"])


def test_diff_keeps_the_first_of_a_repeated_id_and_leaves_configured_ids_alone() -> None:
    d = diff_replicas({}, [rep("a", port=1), rep("a", port=2), rep("r1")], {"r1"})
    assert [(e.id, e.url) for e in d.added] == [("a", "http://127.0.0.1:1")]
    assert d.clashes == ["r1"]


# -- Catalog ------------------------------------------------------------------------------

def test_catalog_aliases_and_model_list() -> None:
    cat = Catalog(["static"], {"mine": "static", "shared": "static"})
    cat.load([ModelEntry(name="m", aliases=["gpt-m", "shared"]), ModelEntry(name="z", scale_from_zero=False)],
             placed=["m"])
    assert cat.target("gpt-m") == "m"
    assert cat.target("shared") == "static"  # the gateway's own configuration wins
    assert cat.target("other") == "other"
    assert sorted(cat.objects) == ["gpt-m", "m", "mine", "shared", "static", "z"]
    assert cat.wakeable("m") is not None and cat.wakeable("z") is None and cat.wakeable("static") is None
    cat.load([], placed=[])
    assert sorted(cat.objects) == ["mine", "shared", "static"] and cat.target("gpt-m") == "gpt-m"


def test_a_models_created_time_stays_across_snapshots() -> None:
    cat = Catalog([], {})
    cat.load([ModelEntry(name="m")], [])
    first = cat.objects["m"]["created"]
    cat.load([ModelEntry(name="m"), ModelEntry(name="n")], [])
    assert cat.objects["m"]["created"] == first


# -- Waker --------------------------------------------------------------------------------

class FakeControl:
    """The control plane's wake: records calls; fails `fail` times first, or refuses."""

    def __init__(self, fail: int = 0, refuse: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.refuse = refuse
        self.served: set[str] = set()

    async def __call__(self, model: str) -> None:
        self.calls.append(model)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("control plane down")
        if self.refuse is not None:
            raise WakeRefused(self.refuse)


def make_waker(ctl: FakeControl) -> Waker:
    return Waker(asyncio.get_running_loop(), ctl, ctl.served.__contains__)


def test_waiters_share_one_call_and_are_released_by_the_snapshot() -> None:
    async def main() -> None:
        ctl = FakeControl()
        w = make_waker(ctl)
        waits = [asyncio.ensure_future(w.wait("m", 5)) for _ in range(10)]
        await asyncio.sleep(0.05)  # time for a second call, if any, to be made
        assert ctl.calls == ["m"]
        assert not any(t.done() for t in waits)
        ctl.served.add("m")
        w.settle(lambda m: True)
        assert await asyncio.gather(*waits) == [("ready", "")] * 10
        assert await w.wait("m", 5) == ("ready", "")  # served now: no call, no wait
        assert ctl.calls == ["m"]

    run(main())


def test_a_wait_ends_at_its_own_deadline_and_the_next_request_asks_again() -> None:
    async def main() -> None:
        ctl = FakeControl()
        w = make_waker(ctl)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await w.wait("m", 0.2) == ("timeout", "")
        assert loop.time() - t0 >= 0.2
        assert await w.wait("m", 0.05) == ("timeout", "")
        assert ctl.calls == ["m", "m"]

    run(main())


def test_a_client_that_leaves_ends_its_wait_but_not_the_others() -> None:
    async def main() -> None:
        ctl = FakeControl()
        w = make_waker(ctl)
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()
        leaving = asyncio.ensure_future(w.wait("m", 5, gone))
        staying = asyncio.ensure_future(w.wait("m", 5))
        await asyncio.sleep(0.02)
        gone.set_result(None)
        assert await leaving == ("gone", "")
        assert not staying.done()
        ctl.served.add("m")
        w.settle(lambda m: True)
        assert await staying == ("ready", "")
        assert ctl.calls == ["m"]

    run(main())


def test_the_call_is_retried_while_the_control_plane_is_unreachable() -> None:
    async def main() -> None:
        ctl = FakeControl(fail=2)
        w = make_waker(ctl)
        waiting = asyncio.ensure_future(w.wait("m", 5))
        while len(ctl.calls) < 3:
            await asyncio.sleep(0.01)
        ctl.served.add("m")
        w.settle(lambda m: True)
        assert await waiting == ("ready", "")
        await asyncio.sleep(0.3)
        assert ctl.calls == ["m"] * 3  # taken on the third: no fourth

    run(main())


def test_a_refusal_answers_every_waiter_and_briefly_the_next_requests() -> None:
    async def main() -> None:
        ctl = FakeControl(refuse="no GPU fits")
        w = make_waker(ctl)
        got = await asyncio.gather(w.wait("m", 5), w.wait("m", 5))
        assert got == [("refused", "no GPU fits")] * 2
        assert await w.wait("m", 5) == ("refused", "no GPU fits")
        assert ctl.calls == ["m"]

    run(main())


def test_a_model_taken_out_of_the_catalog_refuses_its_waiters() -> None:
    async def main() -> None:
        ctl = FakeControl()
        w = make_waker(ctl)
        waiting = asyncio.ensure_future(w.wait("m", 5))
        await asyncio.sleep(0.02)
        w.settle(lambda m: False)
        outcome, reason = await waiting
        assert outcome == "refused" and "removed from the catalog" in reason

    run(main())


# -- ReplicaSet.update --------------------------------------------------------------------

def test_update_keeps_positions_current_and_retires_removed_replicas() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rs = ReplicaSet(loop, [Endpoint(id="r1", url="http://127.0.0.1:1", models=["s"])], HealthChecks())
        added, removed = rs.update([rep("a"), rep("b", key=None)])
        assert [r.id for r in added] == ["a", "b"] and removed == []
        assert [(r.id, r.index) for r in rs.replicas] == [("r1", 0), ("a", 1), ("b", 2)]
        assert rs.replicas[1].pool.auth == b"Authorization: Bearer k\r\n"
        assert rs.replicas[2].pool.auth == b""
        assert rs.router.has_model("m") and rs.router.has_model("s")
        # A request in flight on b: the router counts it by b's position.
        b = rs.replicas[2]
        picked = rs.router.pick("m", [1])
        assert picked == 2 and rs.router.outstanding(2) == 1
        # a leaves: b moves to position 1 and keeps its count; a is retired.
        a = rs.replicas[1]
        added, removed = rs.update([rep("b", key=None)])
        assert added == [] and removed == [a]
        assert (a.index, a.pool.closed, b.index) == (-1, True, 1)
        assert rs.router.outstanding(b.index) == 1
        rs.router.release(b.index)
        assert rs.router.outstanding(b.index) == 0
        rs.failed(a, "late answer")  # a request that ran on a: nothing to eject any more
        assert rs.router.is_healthy(0) and rs.router.is_healthy(1)
        # Nothing placed any more: only the configured endpoint is left.
        rs.update([])
        assert [r.id for r in rs.replicas] == ["r1"] and not rs.router.has_model("m")
        await rs.close()

    run(main())


def test_update_starts_and_stops_probes_of_placed_replicas() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        rs = ReplicaSet(loop, [], HealthChecks())
        rs.start_probes()
        (a,), _ = rs.update([rep("a", port=1)])
        assert a.probe is not None and not a.probe.done()
        probe = a.probe
        rs.update([])
        await asyncio.sleep(0)
        assert a.probe is None and probe.cancelled()
        await rs.close()

    run(main())


def test_update_leaves_out_a_replica_it_cannot_reach() -> None:
    async def main() -> None:
        rs = ReplicaSet(asyncio.get_running_loop(), [], HealthChecks())
        added, _ = rs.update([ReplicaEntry(id="x", model="m", url="https://h:1"),
                              ReplicaEntry(id="y", model="m", url="http://h:1", engine_key="a\r\nX-Evil: 1"),
                              rep("z")])
        assert [r.id for r in added] == ["z"]
        await rs.close()

    run(main())


def test_an_engine_key_must_be_a_plain_token() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        for bad in ("", "two words", "line\nbreak", "é"):
            with pytest.raises(ValueError, match="plain token"):
                Pool(loop, "h", 1, auth=bad)

    run(main())


# -- the control plane's route ------------------------------------------------------------

def wake_request(state: Any, model: str = "m") -> Request:
    return Request(method="POST", path="/internal/v1/wake", path_params={}, query={},
                   body=WakeRequest(model=model), actor="gateway", db=None, state=state)  # type: ignore[arg-type]


def test_the_wake_route_asks_the_control_plane() -> None:
    asked: list[str] = []

    async def wake(model: str) -> None:
        asked.append(model)

    assert run(wake_route(wake_request(SimpleNamespace(wake=wake)))) == WakeReply(model="m", replicas=1)
    assert asked == ["m"]


def test_the_wake_route_without_placement_is_a_404() -> None:
    with pytest.raises(ApiError) as e:
        run(wake_route(wake_request(SimpleNamespace())))
    assert (e.value.status, e.value.code) == (404, "fleet.no_placement")
    assert e.value.message.startswith("this control plane places no replicas, so it cannot start one of model 'm'")


def test_the_wake_route_answers_the_control_planes_refusals() -> None:
    # The control plane raises store errors; the admin layer maps them (store_errors.STATUS).
    for error, status in ((NotFound("models.not_found", "there is no model 'm'", "model"), 404),
                          (Invalid("models.no_scale_from_zero", "model m does not scale from zero",
                                   "model"), 400)):
        async def wake(model: str, error: TenancyError = error) -> None:
            raise error

        with pytest.raises(ApiError) as e:
            run(wake_route(wake_request(SimpleNamespace(wake=wake))))
        assert (e.value.status, e.value.code, e.value.message, e.value.param) == (
            status, error.code, error.message, "model")
