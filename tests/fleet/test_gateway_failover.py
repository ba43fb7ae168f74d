"""A gateway that knows two control planes on one PostgreSQL: SIGKILL the
leader under keyed traffic; once the standby holds the lease the gateway keeps answering with
the key, takes a key issued after the failover from the new leader's snapshot, and every
request it answered 200 is in the store exactly once (its usage moved across, none lost,
none counted twice)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from llmgw.store import connect
from tests.support.cluster import GATEWAY_READY
from tests.support.control_plane import Server
from tests.support.fleet import TAKEOVER_SLACK, TTL, Load, Pair, Post, get, issue_key, keyed_chat
from tests.support.gateway import start_sim
from tests.support.procs import start_process, wait_for
from tests.support.sim import sim_env
from tests.support.usage import stored_finals


def _rows(store: str) -> dict[str, int]:
    """Request id -> its HTTP status, for every final record in the store."""

    async def run() -> dict[str, int]:
        db = await connect(store)
        try:
            return {rec.request_id: rec.http_status for _, rec in await stored_finals(db)}
        finally:
            await db.close()

    return asyncio.run(run())


def poster(srv: Server) -> Post:
    """An admin POST to `srv` answering (status, JSON)."""

    def call(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        status, _, doc = srv.call("POST", path, body=json.dumps(body).encode(),
                                  headers={"content-type": "application/json"})
        return status, doc

    return call


def test_a_gateway_moves_to_the_new_leader_and_loses_no_usage(pair: Pair) -> None:
    a = pair.server("a", models=[])
    b = pair.server("b", models=[])
    assert get(b, "/api/v1/leader")["role"] == "standby"

    with start_sim("--model", "sim-model") as sim:
        gateway = start_process(
            [sys.executable, "-m", "llmgw", "gateway", "--port", "0", "--endpoint",
             f"r1={sim.url}=sim-model", "--control-plane", f"{a.url},{b.url}", "--data-dir",
             str(pair.data_dir)], GATEWAY_READY, timeout=30, env=sim_env())
        with gateway:
            key = issue_key(poster(a))
            wait_for("the key known to the gateway", lambda: keyed_chat(gateway.url, key, None) == 404)
            load = Load(gateway.url, key)
            wait_for("requests flowing", lambda: len(load.done) >= 20)

            killed = time.monotonic()
            a.proc.kill()
            wait_for("the standby leads", lambda: get(b, "/api/v1/leader")["role"] == "leader",
                     timeout=TTL + TAKEOVER_SLACK + 5)
            led = time.monotonic()
            # A key issued on the new leader reaches the gateway with its next snapshot: the
            # gateway follows the new leader (the old one is gone).
            key2 = issue_key(poster(b), "after", first=False)
            issued = time.monotonic()
            wait_for("the new key known to the gateway",
                     lambda: keyed_chat(gateway.url, key2, None) == 404, timeout=5)
            known = time.monotonic()
            assert keyed_chat(gateway.url, key2, [{"role": "user", "content": "hi"}]) == 200
            n_after = len(load.done)
            wait_for("the first key still answered after the failover",
                     lambda: [d for d in load.done[n_after:] if d[2] == 200], timeout=10)
            done = load.stop()

            ok = {d[4] for d in done if d[2] == 200}
            assert len(ok) == sum(1 for d in done if d[2] == 200) and "" not in ok
            failed = [d for d in done if d[2] != 200]
            print(f"{len(done)} requests, {len(failed)} not 200; the standby led "
                  f"{led - killed:.2f}s after the kill; the new key known "
                  f"{known - issued:.2f}s after it was issued")
            assert not failed, failed[:5]  # keys and replicas are in the gateway: no outage

            # Every 200 in the store, once: the usage the dead leader had not taken went to
            # the new one. (Request ids are the rows' primary key: a second copy of a record
            # would have been refused or merged by the store, not added.)
            def stored() -> bool:
                rows = _rows(pair.store)
                return ok <= {rid for rid, status in rows.items() if status == 200}

            wait_for("every answered request's usage in the store", stored, timeout=15)
        rows = _rows(pair.store)
    # After the gateway's stop (it ships what it holds): exactly the 200s the clients saw,
    # the load's and the one chat with the second key.
    assert sum(1 for s in rows.values() if s == 200) == len(ok) + 1
