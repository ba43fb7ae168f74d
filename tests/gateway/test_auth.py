"""API keys on the gateway, against the control-plane stand-in: 401s, revocation, usage, bodies."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmgw.protocol.wire import NULL, UsageBatch
from tests.support.control_stub import ControlStub
from tests.support.gateway import Gateway
from tests.support.gateway_cp import CHAT, chat, control, request, start_authed, wait_ready
from tests.support.procs import Proc

__all__ = ["control"]  # the fixture, imported for pytest


def _err(body: dict[str, object]) -> dict[str, object]:
    assert set(body) == {"error"}
    e = body["error"]
    assert isinstance(e, dict)
    return e


def test_each_refusal_says_why_and_never_echoes_the_key(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, _ = control.add_key()
    _, expired = control.add_key(expires_at=time.time() - 5)
    expired_key = control.keys[-1]
    assert expired_key is expired
    gw = start_authed(gateway_factory, sim.url, control)
    unknown = "sk-llmgw-" + "A" * 40
    cases = {
        "missing": (None, {}),
        "malformed": (None, {"authorization": "Bearer sk-llmgw-short"}),
        "basic": (None, {"authorization": "Basic " + key}),
        "unknown": (unknown, {}),
    }
    seen = {}
    for name, (k, headers) in cases.items():
        status, hdrs, body = chat(gw, k, headers=headers)
        assert status == 401, name
        assert "x-request-id" in hdrs
        e = _err(body)
        assert e["type"] == "invalid_request_error" and e["code"] == "invalid_api_key" and e["param"] is None
        assert key not in str(body) and unknown not in str(body)
        seen[name] = e["message"]
    assert seen == {
        "missing": "this gateway requires an API key: send it as the header `Authorization: Bearer "
                   "sk-llmgw-...` (`llmgw ctl keys issue` makes one)",
        "malformed": "the Authorization header is not `Bearer sk-llmgw-...` followed by 40 characters; "
                     "send the whole key as `llmgw ctl keys issue` printed it",
        "basic": "the Authorization header is not `Bearer sk-llmgw-...` followed by 40 characters; "
                 "send the whole key as `llmgw ctl keys issue` printed it",
        "unknown": "the API key is not valid here: it was revoked or never issued by this control plane; "
                   "ask an operator for a key (`llmgw ctl keys issue`)",
    }
    # Expired: a sentence naming the key's id (never the key) and when.
    status, _, body = chat(gw, None, headers={"authorization": "Bearer " + _key_of(control, expired.key_id)})
    assert status == 401
    msg = _err(body)["message"]
    assert isinstance(msg, str) and msg.startswith(f"the API key {expired.key_id} expired at ")
    # A key in the query string is refused even with a good header.
    status, _, body = request(gw.base_url + f"/chat/completions?api_key={key}", CHAT, key)
    assert status == 401 and "not accepted in the URL" in _err(body)["message"]  # type: ignore[operator]
    assert key not in str(body)
    # /v1/models needs a key too; /health does not.
    assert request(gw.base_url + "/models", None)[0] == 401
    assert request(gw.base_url + "/models", None, key)[0] == 200
    assert request(gw.url + "/health", None)[0] == 200
    assert chat(gw, key)[0] == 200
    assert key not in gw.proc.output


def _key_of(stub: ControlStub, key_id: str) -> str:
    return stub.plaintext[key_id]


def test_not_ready_until_the_first_snapshot(gateway_factory: Callable[..., Gateway], sim: Proc,
                                            control: ControlStub) -> None:
    gw = start_authed(gateway_factory, sim.url, control, ready=False)
    status, hdrs, body = request(gw.url + "/ready", None)
    assert status == 503 and hdrs["retry-after"] == "1"
    assert _err(body)["code"] == "not_ready"
    status, _, body = chat(gw, "sk-llmgw-" + "A" * 40)
    assert status == 503 and _err(body)["code"] == "not_ready"
    key, _ = control.add_key()  # publishes the first snapshot
    wait_ready(gw)
    assert chat(gw, key)[0] == 200


def test_revoked_key_is_refused_within_two_seconds_on_every_worker(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, entry = control.add_key()
    workers = 4
    gw = start_authed(gateway_factory, sim.url, control, {"workers": workers})
    # Every worker serves the key (each request is a new connection, spread by the kernel).
    ok: set[str] = set()
    deadline = time.monotonic() + 30
    while len(ok) < workers and time.monotonic() < deadline:
        status, hdrs, _ = chat(gw, key)
        if status == 200:
            ok.add(hdrs["x-request-id"][:12])
    assert len(ok) == workers
    t0 = time.monotonic()
    control.revoke(entry.key_id)
    refused: dict[str, float] = {}
    late_ok: list[float] = []
    while len(refused) < workers and time.monotonic() < t0 + 10:
        status, hdrs, _ = chat(gw, key)
        worker, at = hdrs["x-request-id"][:12], time.monotonic() - t0
        if status == 401:
            refused.setdefault(worker, at)
        else:
            assert status == 200
            late_ok.append(at)
    assert set(refused) == ok
    assert max(refused.values()) < 2.0, refused
    assert all(at < 2.0 for at in late_ok), late_ok


def test_usage_batches_carry_opens_finals_and_the_principal(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, entry = control.add_key()
    gw = start_authed(gateway_factory, sim.url, control)
    # Two tokens 400 ms apart: still running at a post, so its open is sent before its final
    # (an open whose final is already queued is never sent: tests/unit/test_usage_sink.py).
    status, hdrs, _ = chat(gw, key, headers={"x-sim-fault": "slow=400"})
    assert status == 200
    rid = hdrs["x-request-id"]

    def done(batches: list[UsageBatch]) -> bool:
        return any(f.request_id == rid for b in batches for f in b.ended())

    batches = control.wait_usage(done)
    opens = [o for b in batches for o in b.opens if o.request_id == rid]
    finals = [f for b in batches for f in b.ended() if f.request_id == rid]
    assert len(opens) == 1 and len(finals) == 1
    o, f = opens[0], finals[0]
    for rec in (o, f):
        assert (rec.key_id, rec.user_id, rec.project_id, rec.team_id, rec.org_id) == (
            entry.key_id, "user_a", "proj_a", "team_a", "org_a")
    assert o.prompt_estimate > 0
    assert f.status == "ok" and f.completion_tokens == 2 and f.request_body == NULL and f.response_body is None
    assert any(entry.key_id in b.key_last_used for b in batches)
    assert len({b.gateway_id for b in batches}) == 1
    # This gateway also writes a usage log, so its records are objects (readable in the file);
    # one that only ships them sends rows (tests/unit/test_usage_sink.py, tests/e2e).
    assert any(b.finals for b in batches) and all(not b.rows for b in batches)


def test_bodies_kept_only_where_the_project_asks_and_the_request_allows(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    key, _ = control.add_key(keep_bodies=True)
    gw = start_authed(gateway_factory, sim.url, control)
    rids = {}
    rids["kept"] = chat(gw, key)[1]["x-request-id"]
    rids["stream"] = chat(gw, key, {**CHAT, "stream": True})[1]["x-request-id"]
    rids["header"] = chat(gw, key, headers={"x-llmgw-no-store": "1"})[1]["x-request-id"]
    rids["field"] = chat(gw, key, {**CHAT, "no_store": True})[1]["x-request-id"]
    want = set(rids.values())
    batches = control.wait_usage(lambda bs: want <= {f.request_id for b in bs for f in b.ended()})
    finals = {f.request_id: f for b in batches for f in b.ended()}
    kept = finals[rids["kept"]]
    assert kept.request_body != NULL and b'"messages"' in bytes(kept.request_body)
    assert kept.response_body is not None and b'"choices"' in kept.response_body
    streamed = finals[rids["stream"]]
    assert streamed.response_body is not None and streamed.response_body.startswith(b"data: ")
    assert streamed.response_body.rstrip().endswith(b"data: [DONE]")
    for name in ("header", "field"):
        assert finals[rids[name]].request_body == NULL and finals[rids[name]].response_body is None


def test_the_publisher_answers_a_long_poll_as_soon_as_the_version_changes() -> None:
    import asyncio

    from llmgw.control.snapshots import SnapshotPublisher
    from llmgw.protocol.wire import Snapshot

    async def main() -> None:
        pub = SnapshotPublisher()
        assert await pub.wait(None, timeout=0.01) is None  # nothing published yet
        waiting = asyncio.ensure_future(pub.wait(None))
        v1 = Snapshot(version=1)

        async def build1() -> Snapshot:
            return v1

        assert await pub.refresh(build1)
        assert await waiting == b'{"version":1,"keys":[],"projects":{},"models":[],"replicas":[]}'
        # A waiter holding the current version waits; the same version again wakes nobody.
        held = asyncio.ensure_future(pub.wait(1))
        assert not await pub.refresh(build1)
        await asyncio.sleep(0)
        assert not held.done()

        async def build2() -> Snapshot:
            return Snapshot(version=2)

        assert await pub.refresh(build2)
        assert b'"version":2' in await held
        # After the timeout the same version is answered (the gateway simply asks again).
        assert b'"version":2' in (await pub.wait(2, timeout=0.01) or b"")
        # A lower version (a restored store) is answered at once, not awaited forever.
        assert b'"version":2' in (await pub.wait(7, timeout=5) or b"")

    asyncio.run(asyncio.wait_for(main(), 10))


def test_cli_flags_make_the_control_plane_section(tmp_path: object) -> None:
    import argparse
    from pathlib import Path

    import pytest

    from llmgw.cli.gateway import build_config, configure
    from llmgw.config import ConfigError

    d = Path(str(tmp_path))
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args(["--endpoint", "r1=http://127.0.0.1:1=m", "--control-plane", "http://127.0.0.1:8081",
                         "--data-dir", str(d)])
    with pytest.raises(ConfigError) as e:
        build_config(args)
    assert str(e.value).startswith(f"the gateway cannot use the control plane's secret: {d / 'secret'} is missing")
    (d / "secret").write_text("00" * 32 + "\n")
    (d / "secret").chmod(0o644)
    with pytest.raises(ConfigError) as e:  # a secret others can read is refused, as by the server
        build_config(args)
    assert f"run `chmod 600 {d / 'secret'}`" in str(e.value)
    (d / "secret").chmod(0o600)
    cfg = build_config(args)
    assert cfg.control_plane is not None and cfg.control_plane.data_dir == str(d)
    assert (cfg.control_plane.lease_wait, cfg.control_plane.limits_fail_open) == (0.5, False)
    bad = p.parse_args(["--endpoint", "r1=http://127.0.0.1:1=m", "--control-plane", "ftp://x"])
    with pytest.raises(ConfigError) as e:
        build_config(bad)
    assert "control_plane.url is 'ftp://x'; expected http://HOST:PORT" in str(e.value)
    assert build_config(p.parse_args(["--endpoint", "r1=http://127.0.0.1:1=m"])).control_plane is None


def test_usage_waits_out_a_refusing_control_plane_and_ships_on_sigterm(
        gateway_factory: Callable[..., Gateway], sim: Proc, control: ControlStub) -> None:
    import signal

    from llmgw.protocol.wire import Limits

    key, entry = control.add_key(limits=Limits(concurrency=5))
    gw = start_authed(gateway_factory, sim.url, control)
    control.state.refuse_usage = True
    first = [chat(gw, key)[1]["x-request-id"] for _ in range(3)]
    control.state.refuse_usage = False
    # Kept while refused, sent again once taken.
    control.wait_usage(lambda bs: set(first) <= {f.request_id for b in bs for f in b.ended()})
    last = [chat(gw, key)[1]["x-request-id"] for _ in range(2)]
    # At once, before the next periodic batch: only the shutdown path can send these.
    gw.proc.popen.send_signal(signal.SIGTERM)
    assert gw.proc.popen.wait(15) == 0
    finals = [f.request_id for b in control.state.batches for f in b.ended()]
    assert set(last) <= set(finals)
    assert len(finals) == len(set(finals)) == 5  # each once: nothing sent twice after being taken
    # Its slots went back at shutdown, before the authority would have reclaimed them.
    assert control.state.limits.in_flight(f"key:{entry.key_id}") == 0


def _rec(i: int, body: bytes | None = None) -> object:
    from llmgw.protocol.wire import UsageRecord

    return UsageRecord(request_id=f"r{i}", model="m", upstream_model="m", replica="r1", status="ok",
                       http_status=200, stream=False, prompt_tokens=1, completion_tokens=1,
                       usage_estimated=False, ttft_ms=None, duration_ms=1.0, finish_reason="stop", retries=0,
                       started_at=1.0, key_id="key_1", response_body=body)


def test_usage_sink_keeps_what_failed_drops_what_was_refused_and_splits_large_batches() -> None:
    import asyncio

    import msgspec

    from llmgw.gateway import usage
    from llmgw.protocol.wire import UsageBatch

    async def main() -> None:
        got: list[UsageBatch] = []
        mode = {"fail": True, "queued": False}

        async def ship(body: bytes) -> None:
            if mode["fail"]:
                raise ConnectionRefusedError("down")
            b = msgspec.json.decode(body, type=UsageBatch)
            assert len(body) <= usage.MAX_BATCH_BYTES
            if any(f.request_id == "bad" for f in b.ended()):
                raise usage.BatchRejected("HTTP 400")
            # A record queued while a post is under way is not lost (it goes with the next tick).
            if not mode["queued"]:
                mode["queued"] = True
                sink.record(_rec(99))  # type: ignore[arg-type]
            got.append(b)

        sink = usage.UsageSink(None, ship=ship, gateway_id="gw_1", max_pending=5000)
        for i in range(3):
            sink.record(_rec(i))  # type: ignore[arg-type]
        assert not await sink.send()  # down: kept
        assert len(sink.waiting()) == 3
        mode["fail"] = False
        assert await sink.send()
        assert [f.request_id for b in got for f in b.ended()] == ["r0", "r1", "r2"]
        assert sink.waiting() == ["r99"]  # queued during the post: next tick
        assert await sink.send()
        ids = [f.request_id for b in got for f in b.ended()]
        assert ids == ["r0", "r1", "r2", "r99"] and got[0].key_last_used == {"key_1": 1.0}
        # Refused for good: dropped, the records after it still go.
        got.clear()
        bad = _rec(0)
        bad.request_id = "bad"  # type: ignore[attr-defined]
        sink.record(bad)  # type: ignore[arg-type]
        assert await sink.send()
        sink.record(_rec(5))  # type: ignore[arg-type]
        assert await sink.send()
        assert [f.request_id for b in got for f in b.ended()] == ["r5"]
        # Big bodies: several posts, each under the limit; one too big alone loses its body only.
        got.clear()
        big = b"x" * (usage.MAX_BATCH_BYTES // 3)
        for i in range(4):
            sink.record(_rec(i, big))  # type: ignore[arg-type]
        sink.record(_rec(7, b"y" * (usage.MAX_BATCH_BYTES + 1)))  # type: ignore[arg-type]
        assert await sink.send()
        finals = [f for b in got for f in b.ended()]
        assert [f.request_id for f in finals] == ["r0", "r1", "r2", "r3", "r7"] and len(got) >= 3
        assert finals[-1].response_body is None and finals[0].response_body == big
        # Past the bound: new records are dropped and counted, never unbounded memory.
        mode["fail"] = True
        small = usage.UsageSink(None, ship=ship, gateway_id="gw_2", max_pending=2)
        for i in range(5):
            small.record(_rec(i))  # type: ignore[arg-type]
        assert len(small.waiting()) == 2 and small.dropped == 3

    asyncio.run(asyncio.wait_for(main(), 30))
