"""The agent as a real process against a stub control plane, running real simulator engines."""

from __future__ import annotations

import asyncio
import signal
import sys

from llmgw.v1 import agent_pb2 as pb
from tests.support.agent_cp import StubControlPlane
from tests.support.agent_fakes import sync
from tests.support.procs import chat, free_port, killpg
from tests.support.sim import sim_env

READY, STARTING, PENDING = pb.REPLICA_STATE_READY, pb.REPLICA_STATE_STARTING, pb.REPLICA_STATE_PENDING
PARKED, DRAINING, STOPPED = pb.REPLICA_STATE_PARKED, pb.REPLICA_STATE_DRAINING, pb.REPLICA_STATE_STOPPED


def start(rid: str) -> dict[str, object]:
    return {"start_replica": pb.StartReplica(replica_id=rid, model="sim-model", engine="sim",
                                             engine_key="k-e2e", gpu_uuids=[])}  # fmt: skip


@sync
async def test_agent_end_to_end() -> None:
    cp = StubControlPlane()
    port = await cp.start()
    low = free_port(21)
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmgw", "agent", "--control-plane", f"127.0.0.1:{port}", "--insecure",
        "--fake-gpus", "2xH100-80GB", "--node-id", "n1", "--port-range", f"{low}-{low + 20}",
        "--engine-host", "127.0.0.1", "--heartbeat-interval", "0.2",
        env=sim_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    pids: set[int] = set()
    try:
        reg = (await cp.expect(lambda m: m.WhichOneof("msg") == "register")).register
        assert reg.node_id == "n1" and [g.simulated for g in reg.gpus] == [True, True]
        assert reg.gpu_note == "2 simulated GPUs from --fake-gpus 2xH100-80GB"
        assert ("sim" in [e.name for e in reg.engines]) and reg.cpu_count >= 1
        cp.send(settings=pb.Settings(heartbeat_interval_ms=200, max_failures=3, failure_window_s=60,
                                     restart_backoff_initial_ms=200, restart_backoff_max_ms=1000))  # fmt: skip

        # start: starting, then ready on a port of the range, answering with the key only
        cp.send(**start("r1"))
        await cp.status("r1", STARTING)
        ready = await cp.status("r1", READY)
        assert low <= ready.port <= low + 20 and ready.engine_pid
        pids.add(ready.engine_pid)
        assert await asyncio.to_thread(chat, f"http://127.0.0.1:{ready.port}", "k-e2e") == 200
        assert await asyncio.to_thread(chat, f"http://127.0.0.1:{ready.port}", None) == 401
        beat = (await cp.expect(lambda m: m.WhichOneof("msg") == "heartbeat")).heartbeat
        assert [r.replica_id for r in beat.replicas] == ["r1"] and len(beat.gpus) == 2

        # a crash: restarted after the back-off, on the same port
        killpg(ready.engine_pid)
        pending = await cp.status("r1", PENDING)
        assert pending.reason == "the engine was killed by SIGKILL; restarting in 0.2s"
        again = await cp.status("r1", READY)
        assert again.port == ready.port and again.restarts == 1
        pids.add(again.engine_pid)

        # crashing over and over: parked, with the reason
        killpg(again.engine_pid)
        third = await cp.status("r1", READY)
        pids.add(third.engine_pid)
        killpg(third.engine_pid)
        parked = await cp.status("r1", PARKED)
        assert parked.reason.startswith("the engine failed 3 times within 60s, so it is parked and not "
                                        "restarted; the last time it was killed by SIGKILL")  # fmt: skip

        cp.send(request_logs=pb.RequestLogs(replica_id="r1", lines=5))
        logs = (await cp.expect(lambda m: m.WhichOneof("msg") == "engine_logs")).engine_logs
        assert logs.replica_id == "r1" and 0 < len(logs.lines) <= 5

        # stop: draining, then stopped
        cp.send(**start("r2"))
        r2 = await cp.status("r2", READY)
        pids.add(r2.engine_pid)
        cp.send(stop_replica=pb.StopReplica(replica_id="r2", drain_seconds=5))
        await cp.status("r2", DRAINING)
        await cp.status("r2", STOPPED)

        # the stream is cut (control plane restarted): the agent registers again, with its replicas
        cp.send(**start("r3"))
        r3 = await cp.status("r3", READY)
        pids.add(r3.engine_pid)
        await cp.stop()
        cp2 = StubControlPlane()
        await cp2.start(port)
        reg2 = (await cp2.expect(lambda m: m.WhichOneof("msg") == "register", timeout=20)).register
        assert reg2.node_id == "n1" and reg2.boot_id == reg.boot_id
        assert {(r.replica_id, r.state) for r in reg2.replicas} == {("r1", PARKED), ("r3", READY)}
        assert await asyncio.to_thread(chat, f"http://127.0.0.1:{r3.port}", "k-e2e") == 200  # untouched by the cut
        await cp2.stop()

        agent.send_signal(signal.SIGTERM)  # the agent drains its engines and exits
        assert await asyncio.wait_for(agent.wait(), 15) == 0
    finally:
        killpg(agent.pid)
        await agent.wait()
        for pid in pids:
            killpg(pid)
        await cp.stop()
