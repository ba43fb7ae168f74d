"""The supervisor's life cycle with fake engines and a clock that does not wait."""

from __future__ import annotations

import asyncio
import signal

import msgspec

from llmgw.agent.supervisor import ReplicaInfo, Supervisor, SupervisorSettings
from llmgw.engines.launch import LaunchRequest
from tests.support.agent_fakes import FakeClock, FakeEngines, sync

REQ = LaunchRequest(replica_id="r1", model="m", engine="sim", port=0, host="")


def make(**settings: object) -> tuple[Supervisor, FakeEngines, FakeClock, list[ReplicaInfo]]:
    engines, clock = FakeEngines(), FakeClock()
    seen: list[ReplicaInfo] = []
    settings = {"port_range": (20000, 20009), "engine_host": "127.0.0.1", **settings}
    sup = Supervisor(SupervisorSettings(**settings),  # type: ignore[arg-type]
                     seen.append, clock=clock, spawn=engines.spawn, probe=engines.probe,
                     port_free=lambda host, port: port != 20000)  # fmt: skip
    return sup, engines, clock, seen


async def settle(sup: Supervisor, rid: str, state: str) -> ReplicaInfo:
    for _ in range(1000):
        for info in sup.statuses():
            if info.replica_id == rid and info.state == state:
                return info
        await asyncio.sleep(0)
    raise AssertionError(f"{rid} never became {state}: {sup.statuses()}")


def states(seen: list[ReplicaInfo]) -> list[str]:
    out: list[str] = []
    for info in seen:
        if not out or out[-1] != info.state:
            out.append(info.state)
    return out


@sync
async def test_start_ready_stop() -> None:
    sup, engines, _, seen = make()
    sup.start(REQ)
    info = await settle(sup, "r1", "ready")
    assert info.port == 20001  # 20000 is taken by someone else
    assert (info.kv_events_port, info.kv_replay_port) == (20002, 20003)  # the next free ones
    assert info.pid == 1000
    argv = engines.launches[0].argv
    assert argv[argv.index("--model") + 1] == "m"
    assert argv[argv.index("--kv-events-endpoint") + 1] == "tcp://127.0.0.1:20002"
    sup.start(msgspec.structs.replace(REQ, replica_id="r2"))
    second = await settle(sup, "r2", "ready")
    assert (second.port, second.kv_events_port, second.kv_replay_port) == (20004, 20005, 20006)
    await sup.stop("r2", drain_s=5)
    seen[:] = [i for i in seen if i.replica_id == "r1"]
    await sup.stop("r1", drain_s=5)
    assert engines.procs[0].signals == [signal.SIGTERM]
    assert states(seen) == ["pending", "starting", "ready", "draining", "stopped"]
    assert sup.statuses() == []


@sync
async def test_close_drains_and_refuses_later_starts() -> None:
    sup, engines, _, seen = make()
    sup.start(REQ)
    await settle(sup, "r1", "ready")
    await sup.close(drain_s=5)
    assert engines.procs[0].signals == [signal.SIGTERM] and sup.statuses() == []
    seen.clear()
    info = sup.start(msgspec.structs.replace(REQ, replica_id="r2"))
    assert (info.state, info.reason) == ("parked", "cannot start: the agent is shutting down")
    assert seen == [info]  # reported as any other change, and kept nowhere
    assert len(engines.launches) == 1 and sup.statuses() == []


@sync
async def test_no_free_port_parks_the_replica_with_the_reason() -> None:
    sup, engines, _, seen = make(port_range=(20000, 20001))
    sup.start(REQ)  # 20000 is taken, 20001 is the engine's; its KV event ports find none
    info = await settle(sup, "r1", "parked")
    assert info.reason == "cannot start: no free port in 20000-20001 for an engine"
    assert seen == [info] and sup.statuses() == [info] and engines.launches == []


@sync
async def test_start_is_idempotent() -> None:
    sup, engines, _, _ = make()
    sup.start(REQ)
    await settle(sup, "r1", "ready")
    sup.start(REQ)
    await asyncio.sleep(0)
    assert len(engines.procs) == 1


@sync
async def test_crash_restarts_with_exponential_backoff_then_parks() -> None:
    sup, engines, _clock, seen = make(max_failures=5, backoff_initial_s=1.0, backoff_max_s=4.0)
    engines.crash = 3
    sup.start(REQ)
    info = await settle(sup, "r1", "parked")
    assert len(engines.procs) == 5
    backoffs = [i.reason for i in seen if i.state == "pending" and i.reason]
    assert backoffs == [f"the engine exited with code 3; restarting in {d}s" for d in ("1", "2", "4", "4")]
    assert info.restarts == 4 and info.port == 0
    assert info.reason == ("the engine failed 5 times within 600s, so it is parked and not restarted; "
                           "the last time it exited with code 3; "
                           "its last output line: 'engine 1004 crashed'")  # fmt: skip
    assert (sup.logs("r1") or [])[-1] == "engine 1004 crashed"
    assert sup.logs("r1", 2) == ["engine 1004 starting", "engine 1004 crashed"]


@sync
async def test_failures_outside_the_window_do_not_park() -> None:
    sup, engines, clock, seen = make(max_failures=2, failure_window_s=10.0, backoff_initial_s=1.0)
    sup.start(REQ)
    for _ in range(4):
        await settle(sup, "r1", "ready")
        clock.now += 60  # a long healthy run between crashes
        engines.procs[-1].exit.set_result(1)
        await settle(sup, "r1", "starting")
    await settle(sup, "r1", "ready")
    assert [i.reason for i in seen if i.state == "pending" and i.reason] == [
        "the engine exited with code 1; restarting in 1s"] * 4


@sync
async def test_drain_timeout_then_sigkill() -> None:
    sup, engines, clock, _ = make()
    engines.ignore_term = True
    sup.start(REQ)
    await settle(sup, "r1", "ready")
    await sup.stop("r1", drain_s=7)
    assert engines.procs[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert 7 in clock.sleeps


@sync
async def test_not_ready_in_time_counts_as_a_failure() -> None:
    sup, engines, _, _seen = make(start_timeout_s=3.0, probe_interval_s=1.0, max_failures=1)
    engines.ready = False
    sup.start(REQ)
    info = await settle(sup, "r1", "parked")
    assert "the last time it was not ready within 3s" in info.reason
    assert engines.procs[0].signals == [signal.SIGKILL]


@sync
async def test_unknown_engine_parks_at_once() -> None:
    sup, _, _, _ = make()
    sup.start(LaunchRequest(replica_id="r2", model="m", engine="trt", port=0, host=""))
    info = await settle(sup, "r2", "parked")
    assert info.reason.startswith("cannot start: engine 'trt' is not one this agent runs")


@sync
async def test_stop_during_backoff_and_restart_after_park() -> None:
    sup, engines, _, _ = make(max_failures=1)
    engines.crash = 1
    sup.start(REQ)
    await settle(sup, "r1", "parked")
    engines.crash = None
    sup.start(REQ)  # an operator's restart: failures forgotten
    await settle(sup, "r1", "ready")
    await sup.drain(1)
    assert sup.statuses() == []
