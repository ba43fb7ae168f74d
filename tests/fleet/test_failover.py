"""Failover: two `llmgw server` on one PostgreSQL, two agents with simulated
GPUs knowing both; SIGKILL the leader: the standby takes the lease within its TTL, the agents
move to it, and the replicas keep their ids and engine pids (nothing restarted or placed again).

Also: a standby forwards the admin API to the leader and refuses agents naming the leader's
agent address; and on SQLite a second server on the same store does not start.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceStub
from tests.support.control_plane import READY, Server, scrape
from tests.support.fleet import TAKEOVER_SLACK, TTL, Pair, get
from tests.support.procs import Proc, start_process, wait_for


def refusal(agent_port: int) -> grpc.RpcError:
    """What a control plane's agent service answers to a Register (expected: an error)."""
    with grpc.insecure_channel(f"127.0.0.1:{agent_port}") as channel:
        stream = AgentServiceStub(channel).Connect(
            iter([pb.AgentMessage(register=pb.Register(node_id="probe", hostname="probe"))]),
            timeout=10)
        try:
            first = next(stream)
        except grpc.RpcError as e:
            return e
    raise AssertionError(f"the agent service took the stream: {first}")


def test_standby_forwards_refuses_agents_and_takes_over_without_restarts(pair: Pair) -> None:
    a = pair.server("a")
    b = pair.server("b")
    lead_a, lead_b = get(a, "/api/v1/leader"), get(b, "/api/v1/leader")
    assert (lead_a["role"], lead_b["role"]) == ("leader", "standby")
    assert lead_b["leader_id"] == lead_a["id"] == lead_a["leader_id"]
    assert lead_b["leader_admin_url"] == a.url
    assert lead_b["leader_agent_address"] == f"127.0.0.1:{pair.agent_ports[0]}"

    # The standby refuses agents and names the leader's agent service.
    err = refusal(pair.agent_ports[1])
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert f"leader=127.0.0.1:{pair.agent_ports[0]}" in err.details()  # type: ignore[attr-defined]

    # The standby forwards the admin API: a write through it lands on the leader, reads
    # through it equal the leader's, errors come back as the leader said them.
    status, _, org = b.call("POST", "/api/v1/orgs", body=json.dumps({"name": "acme"}).encode(),
                            headers={"content-type": "application/json"})
    assert status == 201, org
    assert get(b, "/api/v1/orgs") == get(a, "/api/v1/orgs")
    assert [o["name"] for o in get(a, "/api/v1/orgs")] == ["acme"]
    missing_b, missing_a = b.call("GET", "/api/v1/orgs/nope"), a.call("GET", "/api/v1/orgs/nope")
    assert missing_b[0] == missing_a[0] == 404 and missing_b[2] == missing_a[2]
    assert b.call("GET", "/api/v1/orgs", token="wrong")[0] == 401  # the leader checks tokens
    status, _, snap = b.call("GET", "/internal/v1/snapshot", token="gateway")
    assert status == 200 and snap["version"] >= 1
    # A request another standby already forwarded is not forwarded again (no loop).
    status, _, doc = b.call("GET", "/api/v1/orgs", headers={"x-llmgw-forwarded-by": "x"})
    assert status == 503 and doc["error"]["code"] == "control_plane.no_leader"
    # Probes and scrapes are each process's own: the standby says it is one.
    assert b.call("GET", "/health", token=None)[2] == {"status": "ok", "role": "standby"}
    assert scrape(a)["llmgw_control_plane_leader"] == 1
    b_metrics = scrape(b)
    assert b_metrics["llmgw_control_plane_leader"] == 0
    assert b_metrics['llmgw_admin_requests_total{code="201",method="POST",route="forwarded"}'] == 1
    assert "llmgw_nodes" not in str(b_metrics)  # a standby holds no fleet

    # Agents that know the standby first are sent to the leader.
    pair.agent("n1", pair.agent_ports[::-1])
    pair.agent("n2", pair.agent_ports[::-1])

    before = wait_for("two ready replicas, one per node, on the leader", ready_on(a), timeout=40)
    nodes = get(a, "/api/v1/nodes")
    assert {n["id"]: n["connected"] for n in nodes} == {"n1": True, "n2": True}

    # SIGKILL the leader (its process group: granian and its worker).
    killed = time.monotonic()
    a.proc.kill()
    # Until the standby leads, the admin API answers 503 in the OpenAI shape, with a retry.
    status, headers, doc = b.call("GET", "/api/v1/orgs")
    assert status == 503 and headers["retry-after"] == "1", doc
    assert doc["error"]["code"] in ("control_plane.leader_unreachable", "control_plane.no_leader")
    assert doc["error"]["message"].startswith("this control plane is a standby and ")

    def holds() -> bool:
        lead = get(b, "/api/v1/leader")
        return bool(lead["leader_id"] == lead["id"])

    def leads() -> bool:
        return bool(get(b, "/api/v1/leader")["role"] == "leader")

    # The lease: the standby tries again just after the dead leader's lease runs out, which
    # is at most one TTL after the kill (its last renewal was before it), so it holds the
    # lease within the TTL, plus this loop's 0.1 s polling and scheduling.
    wait_for("the standby holds the lease", holds, timeout=TTL + TAKEOVER_SLACK + 5)
    took = time.monotonic() - killed
    print(f"the standby held the lease {took:.2f} s after the kill (TTL {TTL:g} s)")
    assert took < TTL + 0.5, f"took {took:.2f} s"
    # Leading: the parts attached (the fleet loaded from the store).
    wait_for("the standby leads", leads, timeout=TAKEOVER_SLACK + 5)
    assert time.monotonic() - killed < TTL + TAKEOVER_SLACK
    lead_b = get(b, "/api/v1/leader")
    assert lead_b["leader_id"] == lead_b["id"] != lead_a["id"]
    assert scrape(b)["llmgw_control_plane_leader"] == 1

    def both_back() -> bool:
        return {n["id"]: n["connected"] for n in get(b, "/api/v1/nodes")} == {"n1": True,
                                                                              "n2": True}

    wait_for("both agents connected to the new leader", both_back, timeout=30)
    after = wait_for("the same two replicas ready on the new leader", ready_on(b), timeout=10)
    assert after == before  # same ids, same engine pids: nothing restarted
    # Nothing placed twice, now or a few reconcile passes later.
    time.sleep(1.0)
    every = get(b, "/api/v1/replicas?all=true")
    assert {r["id"]: (r["state"], r["pid"]) for r in every} == {
        rid: ("ready", pid) for rid, pid in before.items()}
    # And the old leader's admin port is gone: the standby was the one answering.
    assert a.proc.popen.poll() is not None


# Records which server (its connections' application_name) wrote the fleet's rows, and when
# by the database's clock: a deposed leader's writes would show up here.
_AUDIT = """
CREATE TABLE write_audit (app TEXT, tbl TEXT, op TEXT,
                          at DOUBLE PRECISION DEFAULT EXTRACT(EPOCH FROM clock_timestamp()));
CREATE FUNCTION audit_write() RETURNS trigger AS $$ BEGIN
    INSERT INTO write_audit (app, tbl, op) VALUES (current_setting('application_name'),
                                                   TG_TABLE_NAME, TG_OP);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
""" + "".join(f"CREATE TRIGGER audit_{t} AFTER INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW "
              "EXECUTE FUNCTION audit_write();\n"
              for t in ("nodes", "replicas", "models", "model_scale"))


def sql(store: str, query: str, script: bool = False) -> list[Any]:
    """Runs `query` on the test's database; its rows as tuples (none for a `script` of
    several statements)."""

    async def run() -> list[Any]:
        conn = await asyncpg.connect(store)
        try:
            if script:
                await conn.execute(query)
                return []
            return [tuple(r) for r in await conn.fetch(query)]
        finally:
            await conn.close()

    return asyncio.run(run())


def test_a_paused_leader_is_fenced_when_it_wakes(pair: Pair) -> None:
    # SIGSTOP the leader past its TTL: the standby takes over. SIGCONT: whatever the old
    # leader's tasks try first (a reconcile pass, buffered heartbeats, its lease round), it
    # writes nothing (the epoch fence), steps down, and the agents stay with the new leader.
    a = pair.server("a")
    b = pair.server("b")
    pair.agent("n1", pair.agent_ports)
    pair.agent("n2", pair.agent_ports)
    before = wait_for("two ready replicas, one per node, on the leader", ready_on(a), timeout=40)
    sql(pair.store, _AUDIT, script=True)
    wait_for("the leader's writes audited", lambda: sql(
        pair.store, "SELECT 1 FROM write_audit WHERE app = 'llmgw-a'"))

    os.killpg(a.proc.popen.pid, signal.SIGSTOP)
    try:
        [(paused_at,)] = sql(pair.store, "SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        wait_for("the standby leads", lambda: get(b, "/api/v1/leader")["role"] == "leader",
                 timeout=TTL + TAKEOVER_SLACK + 5)
        time.sleep(1.0)  # the old leader's heartbeat clocks and timers well past due
    finally:
        os.killpg(a.proc.popen.pid, signal.SIGCONT)
    lead_b = get(b, "/api/v1/leader")

    def stood_down() -> bool:
        doc = get(a, "/api/v1/leader")
        return bool(doc["role"] == "standby" and doc["leader_id"] == lead_b["id"])

    wait_for("the old leader is a standby of the new one", stood_down, timeout=10)

    def both_on_b() -> bool:
        return {n["id"]: n["connected"] for n in get(b, "/api/v1/nodes")} == {"n1": True,
                                                                              "n2": True}

    wait_for("both agents connected to the new leader", both_on_b, timeout=30)
    after = wait_for("the same two replicas ready on the new leader", ready_on(b), timeout=10)
    assert after == before  # nothing restarted
    time.sleep(1.0)  # a few more reconcile passes of both
    assert get(a, "/api/v1/leader")["role"] == "standby"
    assert both_on_b()
    assert {r["id"]: (r["state"], r["pid"]) for r in get(b, "/api/v1/replicas?all=true")} == {
        rid: ("ready", pid) for rid, pid in before.items()}
    writes = sql(pair.store, "SELECT app, tbl, op FROM write_audit WHERE at >= "
                 f"{paused_at} ORDER BY at")
    assert [w for w in writes if w[0] == "llmgw-a"] == []
    assert ("llmgw-b", "nodes", "UPDATE") in writes  # the audit sees the new leader's
    down = [line for line in a.proc.output.splitlines() if "stepping down" in line]
    print("the old leader:", *down, sep="\n  ")
    assert down


def ready_on(srv: Server) -> Callable[[], dict[str, int] | None]:
    """A probe: {replica id: engine pid} of the ready replicas `srv` lists, once there are two,
    one on each node."""

    def probe() -> dict[str, int] | None:
        reps = [r for r in get(srv, "/api/v1/replicas") if r["state"] == "ready" and r["pid"]]
        if len(reps) == 2 and {r["node"] for r in reps} == {"n1", "n2"}:
            return {r["id"]: r["pid"] for r in reps}
        return None

    return probe


def test_a_second_server_on_one_sqlite_store_does_not_start(tmp_path: Path) -> None:
    first = start_process([sys.executable, "-m", "llmgw", "server", "--data-dir",
                           str(tmp_path / "data"), "--port", "0"], READY, timeout=30)
    with first:
        second = subprocess.run([sys.executable, "-m", "llmgw", "server", "--data-dir",
                                 str(tmp_path / "data"), "--port", "0"],
                                check=False, capture_output=True, text=True, timeout=30)
        assert second.returncode == 2
        assert second.stderr.replace(str(tmp_path), "TMP") == (
            f"error: another llmgw server (pid {first.popen.pid}) already runs on the SQLite "
            "store TMP/data/llmgw.db (data dir TMP/data); on SQLite there is exactly one "
            "control plane. Stop it first, or give this one another --data-dir; for several "
            "control planes, use one PostgreSQL store (--store postgresql://...)\n")
        assert get_leader(first)["role"] == "leader"


def test_a_server_whose_agent_port_is_taken_says_so_and_does_not_start(tmp_path: Path) -> None:
    # A client connection's local port is enough to keep gRPC from listening there.
    with socket.create_server(("127.0.0.1", 0)) as other, \
            socket.create_connection(other.getsockname()) as client:
        port = client.getsockname()[1]
        config = tmp_path / "server.yaml"
        config.write_text(json.dumps({"control_plane": {"agent_insecure": True, "agent_port": port}}))
        r = subprocess.run([sys.executable, "-m", "llmgw", "server", "--data-dir",
                            str(tmp_path / "data"), "--port", "0", "--config",
                            str(config)], check=False, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""  # no ready line
    assert r.stderr == (
        f"error: cannot listen for agents on 127.0.0.1:{port}: Address already in use; another "
        "process holds that port (another control plane?). Stop it, or set "
        "control_plane.agent_port in --config to a free port\n")


def get_leader(proc: Proc) -> Any:
    """GET /api/v1/leader of a server started in a test's data dir."""
    data_dir = Path(proc.args[proc.args.index("--data-dir") + 1])
    srv = Server(proc, proc.url, data_dir, (data_dir / "admin-token").read_text().strip())
    return get(srv, "/api/v1/leader")


def test_a_leader_stopped_cleanly_hands_over_at_once(pair: Pair) -> None:
    a = pair.server("a")
    b = pair.server("b")
    assert get(b, "/api/v1/leader")["role"] == "standby"
    stopped = time.monotonic()
    a.proc.popen.send_signal(signal.SIGTERM)
    assert a.proc.popen.wait(15) == 0

    def leads() -> bool:
        return bool(get(b, "/api/v1/leader")["role"] == "leader")

    wait_for("the standby leads", leads, timeout=TTL + TAKEOVER_SLACK)
    # The lease was given up, not waited out: the standby's next try (every TTL/3) takes it.
    assert time.monotonic() - stopped < TTL
